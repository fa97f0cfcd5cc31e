//! Sessions through the library: a sandbox that lives across calls, with a Python, Node or
//! bash interpreter that keeps its state. Real interpreters, real sandboxes, the host
//! checked after each test.

use std::time::Duration;

use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Session, SessionSpec};
use codecage::{Rootfs, SandboxSpec};
use serde_json::Value;

use super::common::*;

/// A session on `rootfs` ("host" or the built image).
pub(super) fn session_on(lang: Lang, rootfs: Rootfs, memory: Option<u64>) -> Session {
    in_process_launcher();
    let mut sandbox = SandboxSpec {
        rootfs,
        init_exe: env!("CARGO_BIN_EXE_codecage").into(),
        ..Default::default()
    };
    if let (Some(memory), Some(limits)) = (memory, sandbox.limits.as_mut()) {
        limits.memory = memory;
    }
    let mut env = vec![("PYTHONUNBUFFERED".to_string(), "1".to_string())];
    env.push(("OPENBLAS_NUM_THREADS".into(), "1".into()));
    let spec = SessionSpec {
        sandbox,
        lang,
        context_exec: Vec::new(),
        env,
        timeout: Duration::from_secs(30 * slowdown()),
        output_limit: 1 << 20,
        outputs: None,
    };
    Session::start(spec).unwrap_or_else(|e| panic!("the session did not start: {e}"))
}

/// A session started ahead of a request (the warm pool's way) runs at the lowest CPU
/// weight and without a CPU quota, and at the default weight and its quota once handed
/// over; a call made before the hand-over hands it over first, so no code runs without
/// the quota (a library user who forgets `handed_over` is held to it all the same). On
/// every cgroup layout a lane has (v1 `cpu.shares` and `cpu.cfs_quota_us`, v2 `cpu.weight`
/// and `cpu.max`).
#[test]
fn a_session_started_ahead_is_in_the_background_until_handed_over() {
    as_root(|| {
        in_process_launcher();
        let spec = SessionSpec {
            sandbox: SandboxSpec {
                init_exe: env!("CARGO_BIN_EXE_codecage").into(),
                ..Default::default()
            },
            lang: Lang::Python,
            context_exec: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(30 * slowdown()),
            output_limit: 1 << 20,
            outputs: None,
        };
        let mut s = Session::start_ahead(spec).expect("the session did not start");
        let weights = || cpu_weights(std::process::id());
        // Other tests of this process may run sandboxes of their own: this session's
        // cgroup is the one in the background.
        let background: Vec<_> = weights()
            .into_iter()
            .filter(|(_, v)| *v == 1 || *v == 2)
            .collect();
        assert_eq!(background.len(), 1, "{background:?} of {:?}", weights());
        // Its quota file, beside the weight's: lifted.
        let quota = cpu_quotas(std::process::id())
            .into_iter()
            .find(|(file, _)| file.parent() == background[0].0.parent())
            .expect("the background session's cgroup has a CPU quota file");
        assert!(
            matches!(quota.1.as_str(), "-1" | "max 100000"),
            "{} is {:?} in the background",
            quota.0.display(),
            quota.1
        );
        assert_eq!(text(&call(&mut s, "1 + 1")), "2");
        let now = std::fs::read_to_string(&background[0].0).unwrap();
        assert!(
            matches!(now.trim(), "1024" | "100"),
            "{} is {now:?} after the handover",
            background[0].0.display()
        );
        // The default limits' half a CPU.
        let now = std::fs::read_to_string(&quota.0).unwrap();
        assert!(
            matches!(now.trim(), "50000" | "50000 100000"),
            "{} is {now:?} after the handover",
            quota.0.display()
        );
        // The call did the hand-over; the pool's own, after it, changes nothing.
        s.handed_over().unwrap();
        assert_eq!(std::fs::read_to_string(&quota.0).unwrap(), now);
        assert_eq!(text(&call(&mut s, "2 + 2")), "4");
        s.close().unwrap();
    });
}

pub(super) fn session(lang: Lang) -> Session {
    session_on(lang, Rootfs::Host, None)
}

pub(super) fn call(session: &mut Session, code: &str) -> Value {
    let outcome = session.execute(
        &Call {
            code: code.into(),
            ..Call::default()
        },
        &mut |_| {},
    );
    json(&outcome)
}

pub(super) fn json(outcome: &CallOutcome) -> Value {
    serde_json::to_value(outcome).unwrap()
}

pub(super) fn text(result: &Value) -> &str {
    result["result"]["text/plain"].as_str().unwrap_or_default()
}

#[test]
fn python_state_and_imports_persist() {
    as_root(|| {
        let mut s = session(Lang::Python);
        let first = call(&mut s, "x = 41\nimport json");
        assert_eq!(first["error"], Value::Null, "{first}");
        assert_eq!(first["state"]["preserved"], true);
        let second = call(&mut s, "json.dumps(x + 1)");
        assert_eq!(text(&second), "'42'", "{second}");
        assert_eq!(second["execution_count"], 2);
        s.close().unwrap();
    });
}

#[test]
fn python_output_exceptions_and_top_level_await() {
    as_root(|| {
        let mut s = session(Lang::Python);
        let out = call(
            &mut s,
            "print('hi'); import sys; print('err', file=sys.stderr); 1 + 1",
        );
        assert_eq!(out["stdout"], "hi\n", "{out}");
        assert_eq!(out["stderr"], "err\n", "{out}");
        assert_eq!(text(&out), "2");
        let out = call(&mut s, "a = 1\n\ndef f():\n    return 1 / 0\n\nf()");
        assert_eq!(out["error"], "exception", "{out}");
        assert_eq!(out["exception"]["name"], "ZeroDivisionError");
        let tb = out["exception"]["traceback"].to_string();
        assert!(tb.contains("line 4") && tb.contains("return 1 / 0"), "{tb}");
        assert!(!tb.contains("python.py"), "driver frames leaked: {tb}");
        // asyncio is imported on first use (start-up), and the loop the driver makes then
        // is the one every later cell's get_event_loop() and top-level await share.
        let out = call(&mut s, "'asyncio' in sys.modules");
        assert_eq!(text(&out), "False", "{out}");
        let out = call(
            &mut s,
            "import asyncio\nl = asyncio.get_event_loop()\nt = l.create_task(asyncio.sleep(0, 'later'))",
        );
        assert_eq!(out["error"], Value::Null, "{out}");
        let out = call(&mut s, "import asyncio\nawait asyncio.sleep(0.01)\na + 1");
        assert_eq!(text(&out), "2", "{out}");
        let out = call(&mut s, "(await t, asyncio.get_event_loop() is l, t.done())");
        assert_eq!(text(&out), "('later', True, True)", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn python_stdin_reaches_input() {
    as_root(|| {
        let mut s = session(Lang::Python);
        let out = s.execute(
            &Call {
                code: "name = input(); print('hello', name)".into(),
                stdin: Some("world\n".into()),
                ..Call::default()
            },
            &mut |_| {},
        );
        assert_eq!(json(&out)["stdout"], "hello world\n", "{}", json(&out));
        s.close().unwrap();
    });
}

#[test]
fn a_timeout_interrupts_and_keeps_the_state() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "kept = 'yes'");
        let out = s.execute(
            &Call {
                code: "print('before', flush=True)\nwhile True: pass".into(),
                timeout: Some(Duration::from_secs(slowdown())),
                ..Call::default()
            },
            &mut |_| {},
        );
        let out = json(&out);
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["state"]["preserved"], true, "{out}");
        assert_eq!(out["stdout"], "before\n");
        assert_eq!(text(&call(&mut s, "kept")), "'yes'");
        s.close().unwrap();
    });
}

#[test]
fn a_call_that_ignores_sigint_is_killed_and_the_interpreter_restarted() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "lost = 1");
        let out = s.execute(
            &Call {
                code:
                    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
                        .into(),
                timeout: Some(Duration::from_secs(slowdown())),
                ..Call::default()
            },
            &mut |_| {},
        );
        let out = json(&out);
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["state"]["preserved"], false, "{out}");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        let next = call(&mut s, "'lost' in dir()");
        assert_eq!(text(&next), "False", "{next}");
        s.close().unwrap();
    });
}

#[test]
fn reset_clears_variables_and_keeps_work() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "x = 1\nopen('/work/kept.txt', 'w').write('data')");
        s.reset(None).unwrap();
        let out = call(&mut s, "('x' in dir(), open('/work/kept.txt').read())");
        assert_eq!(text(&out), "(False, 'data')", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn a_memory_bomb_is_oom_and_the_next_call_works() {
    as_root(|| {
        let mut s = session_on(Lang::Python, Rootfs::Host, Some(96 << 20));
        let out = call(&mut s, "x = []\nwhile True: x.append(bytearray(8 << 20))");
        assert_eq!(out["error"], "oom", "{out}");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        let next = call(&mut s, "1 + 1");
        assert_eq!(text(&next), "2", "{next}");
        s.close().unwrap();
    });
}

/// A call's peak memory is its own, not the session's so far, where the kernel can reset
/// it: v1, and v2 since Linux 6.12, where a reset holds only for reads through the fd that
/// wrote it (the session keeps memory.peak open for both). On v2 from 5.19 to 6.11 the
/// figure is the session's peak so far; before 5.19 v2 keeps no peak, and a call that did
/// not meet its limit has none.
#[test]
fn a_calls_peak_memory_is_its_own() {
    as_root(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let release = release.trim();
        let mut numbers = release
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        // The memory controller on the unified tree: pure v2 (here a hybrid host's is v1).
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        let mut s = session(Lang::Python);
        let big = call(&mut s, "b = b'x' * (96 << 20)\ndel b");
        let small = call(&mut s, "1 + 1");
        if v2 && version < (5, 19) {
            assert!(
                big["peak_memory_bytes"].is_null(),
                "kernel {release}: {big}"
            );
            s.close().unwrap();
            return;
        }
        let peak = |out: &Value| {
            out["peak_memory_bytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("kernel {release}: {out}"))
        };
        assert!(peak(&big) >= 96 << 20, "{big}");
        if !v2 || version >= (6, 12) {
            assert!(
                peak(&small) < 48 << 20,
                "kernel {release}: the second call's peak {} is not its own (the first's {})",
                peak(&small),
                peak(&big)
            );
        } else {
            assert!(peak(&small) >= peak(&big), "kernel {release}: {small}");
        }
        s.close().unwrap();
    });
}

#[test]
fn bash_keeps_cd_variables_and_exports_and_reports_the_status() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        let out = call(
            &mut s,
            "mkdir -p /work/d && cd /work/d && export GREETING=hi && count=3",
        );
        assert_eq!(out["error"], Value::Null, "{out}");
        assert_eq!(out["cwd"], "/work/d");
        let out = call(
            &mut s,
            "echo $GREETING $count $(pwd); bash -c 'echo $GREETING'; false",
        );
        assert_eq!(out["stdout"], "hi 3 /work/d\nhi\n", "{out}");
        assert_eq!(out["exit_code"], 1, "{out}");
        let out = s.execute(
            &Call {
                code: "read line; echo got $line".into(),
                stdin: Some("input\n".into()),
                ..Call::default()
            },
            &mut |_| {},
        );
        assert_eq!(json(&out)["stdout"], "got input\n", "{}", json(&out));
        s.close().unwrap();
    });
}

#[test]
fn bash_timeout_interrupts_the_foreground_job() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        call(&mut s, "kept=yes");
        let out = s.execute(
            &Call {
                code: "echo start; sleep 100; echo not-reached".into(),
                timeout: Some(Duration::from_secs(slowdown())),
                ..Call::default()
            },
            &mut |_| {},
        );
        let out = json(&out);
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["stdout"], "start\n", "{out}");
        assert_eq!(out["state"]["preserved"], true, "{out}");
        assert_eq!(call(&mut s, "echo $kept")["stdout"], "yes\n");
        s.close().unwrap();
    });
}

#[test]
fn node_keeps_variables_and_required_modules() {
    as_root(|| {
        let mut s = session(Lang::Node);
        let out = call(&mut s, "const path = require('path'); let n = 41;");
        assert_eq!(out["error"], Value::Null, "{out}");
        let out = call(&mut s, "path.join('a', 'b') + ' ' + (n + 1)");
        assert_eq!(text(&out), "'a/b 42'", "{out}");
        let out = call(&mut s, "await new Promise(r => setTimeout(() => r(7), 10))");
        assert_eq!(text(&out), "7", "{out}");
        let out = call(&mut s, "null.x");
        assert_eq!(out["error"], "exception", "{out}");
        assert_eq!(out["exception"]["name"], "TypeError", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn two_sessions_see_neither_files_nor_processes_of_each_other() {
    as_root(|| {
        let mut a = session(Lang::Bash);
        let mut b = session(Lang::Bash);
        call(&mut a, "echo secret > /work/a.txt; sleep 300 &");
        let out = call(&mut b, "ls /work; ps -e -o comm= | grep -c sleep");
        assert_eq!(out["stdout"], "0\n", "{out}");
        a.close().unwrap();
        b.close().unwrap();
    });
}
