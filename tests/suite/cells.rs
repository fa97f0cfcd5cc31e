//! What real cells do to a session, through the library: print the way each language's
//! users print, close or replace their streams, leave children running past a timeout,
//! send cells larger than a socket buffer or holding a NUL byte, end the interpreter. Each
//! test failed before the session handled it; the host is checked after each.

use std::time::Duration;

use codecage::runner::Lang;
use codecage::session::{Call, Session};
use serde_json::Value;

use super::common::*;
use super::sessions::{call, json, session, text};

fn call_with(s: &mut Session, code: &str, timeout: Option<Duration>, stdin: Option<&str>) -> Value {
    json(&s.execute(
        &Call {
            code: code.into(),
            timeout,
            stdin: stdin.map(str::to_string),
            ..Call::default()
        },
        &mut |_| {},
    ))
}

#[test]
fn node_console_writes_to_the_call_s_streams_in_order() {
    as_root(|| {
        let mut s = session(Lang::Node);
        let out = call(&mut s, "console.log('hi')");
        assert_eq!(out["stdout"], "hi\n", "{out}");
        assert_eq!(out["error"], Value::Null, "{out}");
        let out = call(
            &mut s,
            "const path = require('path'); const k = 6;\n\
             console.log(k * 7, path.sep);\n\
             process.stdout.write('direct\\n');\n\
             console.info('info'); console.error('oops'); console.warn('careful');\n\
             console.dir({a: 1});\n\
             console.table([{x: 1}]);",
        );
        let stdout = out["stdout"].as_str().unwrap();
        assert!(
            stdout.starts_with("42 /\ndirect\ninfo\n{ a: 1 }\n"),
            "{out}"
        );
        assert!(stdout.contains("│ (index) │ x │"), "console.table: {out}");
        assert_eq!(out["stderr"], "oops\ncareful\n", "{out}");
        // A child's inherited output lands in order with the driver's writes.
        let out = call(
            &mut s,
            "console.log('a'); require('child_process').execSync('echo b', {stdio: 'inherit'}); console.log('c')",
        );
        assert_eq!(out["stdout"], "a\nb\nc\n", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn python_survives_a_cell_that_closes_or_replaces_its_streams() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "kept = 'yes'");
        for breaker in [
            "import os; os.close(1)",
            "import sys; sys.stdout.close()",
            "import sys, io; sys.stdout = io.StringIO()",
            "import os; os.close(2); os.close(0)",
            "import os; os.dup2(os.open('/dev/null', os.O_WRONLY), 1)",
        ] {
            call(&mut s, breaker);
            let out = call(
                &mut s,
                "import sys; print('back'); print('err', file=sys.stderr); kept",
            );
            assert_eq!(out["stdout"], "back\n", "after {breaker}: {out}");
            assert_eq!(out["stderr"], "err\n", "after {breaker}: {out}");
            assert_eq!(text(&out), "'yes'", "after {breaker}: {out}");
            assert_eq!(out["state"]["preserved"], true, "after {breaker}: {out}");
        }
        // A subprocess writes to fd 1 itself.
        let out = call(
            &mut s,
            "import subprocess; subprocess.run(['echo', 'child'])",
        );
        assert_eq!(out["stdout"], "child\n", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn python_asks_for_a_new_interpreter_when_its_own_copies_are_closed() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "lost = 1");
        let out = call(
            &mut s,
            "import os, __codecage__; os.closerange(0, 3)\n\
             for fd in __codecage__.SAVED.values(): os.close(fd)",
        );
        assert_eq!(out["state"]["restarted"], true, "{out}");
        assert_eq!(out["state"]["preserved"], false, "{out}");
        assert!(
            out["message"].as_str().unwrap().contains("started again"),
            "{out}"
        );
        let out = call(&mut s, "print('fresh'); 'lost' in dir()");
        assert_eq!(out["stdout"], "fresh\n", "{out}");
        assert_eq!(text(&out), "False", "{out}");
        // Every fd, the channel too: the interpreter cannot answer; a new one is started.
        let out = call(&mut s, "import os; os.closerange(0, 1 << 16)");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        let out = call(&mut s, "print('again')");
        assert_eq!(out["stdout"], "again\n", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn node_survives_a_cell_that_closes_or_replaces_its_streams() {
    as_root(|| {
        let mut s = session(Lang::Node);
        call(&mut s, "var kept = 'yes'");
        for breaker in [
            "require('fs').closeSync(1)",
            "process.stdout.write = () => true; console.log = () => {}",
            "process.stdout.destroy(); process.stderr.end()",
            "const fs = require('fs'); fs.closeSync(1); fs.openSync('/dev/null', 'w')",
        ] {
            call(&mut s, breaker);
            let out = call(&mut s, "console.log('back'); console.error('err'); kept");
            assert_eq!(out["stdout"], "back\n", "after {breaker}: {out}");
            assert_eq!(out["stderr"], "err\n", "after {breaker}: {out}");
            assert_eq!(text(&out), "'yes'", "after {breaker}: {out}");
        }
        s.close().unwrap();
    });
}

#[test]
fn bash_survives_a_cell_that_closes_or_redirects_its_streams() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        call(&mut s, "kept=yes");
        for breaker in [
            "exec 1>&-",
            "exec 2>&-",
            "exec >/dev/null 2>&1",
            "exec 0<&-",
        ] {
            let out = call(&mut s, breaker);
            assert_eq!(out["error"], Value::Null, "{breaker}: {out}");
            let out = call(&mut s, "echo back $kept; echo err >&2");
            assert_eq!(out["stdout"], "back yes\n", "after {breaker}: {out}");
            assert_eq!(out["stderr"], "err\n", "after {breaker}: {out}");
            assert_eq!(out["exit_code"], 0, "after {breaker}: {out}");
        }
        s.close().unwrap();
    });
}

#[test]
fn bash_exit_and_set_e_end_the_shell_with_their_status() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        call(&mut s, "lost=1; cd /tmp");
        let out = call(&mut s, "echo bye; exit 3");
        assert_eq!(out["stdout"], "bye\n", "{out}");
        assert_eq!(out["exit_code"], 3, "{out}");
        assert_eq!(out["error"], Value::Null, "{out}");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        let out = call(&mut s, "echo \"[$lost]\" $PWD");
        assert_eq!(out["stdout"], "[] /work\n", "{out}");
        // set -e ends the cell (and so the shell) at the first failing command.
        let out = call(&mut s, "set -e\necho one\nfalse\necho not-reached");
        assert_eq!(out["stdout"], "one\n", "{out}");
        assert_eq!(out["exit_code"], 1, "{out}");
        // set -u and set -e of one cell stay for the next ones, not for the driver.
        let out = call(&mut s, "set -u; echo ok");
        assert_eq!(out["stdout"], "ok\n", "{out}");
        let out = call(&mut s, "echo \"${undefined_var:-default}\"");
        assert_eq!(out["stdout"], "default\n", "{out}");
        assert_eq!(out["state"]["preserved"], true, "{out}");
        s.close().unwrap();
    });
}

#[test]
fn node_process_exit_gives_its_status_and_a_new_interpreter() {
    as_root(|| {
        let mut s = session(Lang::Node);
        let out = call(&mut s, "console.log('bye'); process.exit(4)");
        assert_eq!(out["stdout"], "bye\n", "{out}");
        assert_eq!(out["exit_code"], 4, "{out}");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        assert_eq!(text(&call(&mut s, "1 + 1")), "2");
        s.close().unwrap();
    });
}

#[test]
fn a_timed_out_call_s_children_are_stopped_and_listed_and_detached_ones_left() {
    as_root(|| {
        let mut s = session(Lang::Python);
        call(&mut s, "kept = 'yes'");
        let out = call_with(
            &mut s,
            "import subprocess, time\n\
             spinner = subprocess.Popen(['sh', '-c', 'trap \"\" INT; while :; do :; done'])\n\
             polite = subprocess.Popen(['sleep', '300'])\n\
             daemon = subprocess.Popen(['sleep', '301'], start_new_session=True)\n\
             time.sleep(300)",
            Some(Duration::from_secs(slowdown())),
            None,
        );
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["state"]["preserved"], true, "{out}");
        let killed = out["killed"].as_array().unwrap_or_else(|| panic!("{out}"));
        assert_eq!(
            killed.len(),
            1,
            "only the spinner outlived the interrupt: {out}"
        );
        assert!(
            killed[0]["command"]
                .as_str()
                .unwrap()
                .starts_with("sh -c trap"),
            "{out}"
        );
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .contains("were killed: sh -c"),
            "{out}"
        );
        let ps = call(
            &mut s,
            "import subprocess; print(subprocess.run(['ps', '-e', '-o', 'args='], capture_output=True, text=True).stdout)",
        );
        let procs = ps["stdout"].as_str().unwrap();
        assert!(!procs.contains("while :"), "the spinner is gone: {procs}");
        assert!(
            !procs.contains("sleep 300"),
            "SIGINT ended the polite child: {procs}"
        );
        assert!(
            procs.contains("sleep 301"),
            "a new session is left: {procs}"
        );
        assert_eq!(text(&call(&mut s, "kept")), "'yes'");
        s.close().unwrap();
    });
}

#[test]
fn bash_timeout_stops_the_call_s_jobs_but_not_nohup_setsid_or_earlier_ones() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        call(&mut s, "sleep 303 &");
        let out = call_with(
            &mut s,
            "sh -c 'trap \"\" INT; while :; do :; done' &\n\
             nohup sleep 302 >/dev/null 2>&1 &\n\
             setsid sleep 304 &\n\
             sleep 100",
            Some(Duration::from_secs(slowdown())),
            None,
        );
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["killed"].as_array().map(Vec::len), Some(1), "{out}");
        let out = call(&mut s, "ps -e -o args=");
        let procs = out["stdout"].as_str().unwrap();
        assert!(!procs.contains("while :"), "{procs}");
        assert!(
            procs.contains("sleep 303"),
            "an earlier call's job is left: {procs}"
        );
        assert!(procs.contains("sleep 302"), "nohup ... & is left: {procs}");
        assert!(procs.contains("sleep 304"), "setsid is left: {procs}");
        s.close().unwrap();
    });
}

/// A cell of `size` bytes: one string literal of that many characters, and its length.
fn big_cell(lang: Lang, size: usize) -> String {
    let body = "x".repeat(size);
    match lang {
        Lang::Python => format!("big = '{body}'\nlen(big)"),
        Lang::Bash => format!("big='{body}'\necho ${{#big}}"),
        _ => format!("var big = '{body}';\nbig.length"),
    }
}

#[test]
fn cells_larger_than_the_socket_buffer_reach_the_interpreter_whole() {
    as_root(|| {
        for lang in [Lang::Python, Lang::Node, Lang::Bash] {
            let mut s = session(lang);
            call(
                &mut s,
                match lang {
                    Lang::Bash => "kept=yes",
                    Lang::Python => "kept = 'yes'",
                    _ => "var kept = 'yes'",
                },
            );
            for size in [260_000, 1 << 20] {
                let out = call(&mut s, &big_cell(lang, size));
                assert_eq!(
                    out["error"],
                    Value::Null,
                    "{lang:?} {size}: {}",
                    out["message"]
                );
                assert_eq!(out["state"]["preserved"], true, "{lang:?} {size}");
                let got = match lang {
                    Lang::Bash => out["stdout"].as_str().unwrap().trim().to_string(),
                    _ => text(&out).to_string(),
                };
                assert_eq!(got, size.to_string(), "{lang:?}");
            }
            // A non-ASCII cell cut by the socket anywhere arrives intact too.
            // 270 KB: past the socket's buffer.
            let wide = "é€😀".repeat(30_000);
            let code = match lang {
                Lang::Python => format!("len('{wide}')"),
                Lang::Bash => format!("w='{wide}'; echo ${{#w}}"),
                _ => format!("[...'{wide}'].length"),
            };
            let out = call(&mut s, &code);
            let got = match lang {
                Lang::Bash => out["stdout"].as_str().unwrap().trim().to_string(),
                _ => text(&out).to_string(),
            };
            assert_eq!(got, "90000", "{lang:?}: {}", out["message"]);
            let kept = call(
                &mut s,
                if lang == Lang::Bash {
                    "echo $kept"
                } else {
                    "kept"
                },
            );
            assert!(kept.to_string().contains("yes"), "{lang:?}: {kept}");
            s.close().unwrap();
        }
    });
}

#[test]
fn a_nul_byte_is_refused_in_a_bash_cell_and_passed_through_on_stdin() {
    as_root(|| {
        let mut s = session(Lang::Bash);
        let out = call(&mut s, "echo a\0b");
        assert_eq!(out["error"], "invalid_request", "{out}");
        assert!(out["message"].as_str().unwrap().contains("NUL"), "{out}");
        let out = call_with(&mut s, "od -An -c | tr -s ' '", None, Some("a\0b"));
        assert_eq!(out["stdout"], " a \\0 b\n", "{out}");
        let out = call(&mut s, "echo still here");
        assert_eq!(out["stdout"], "still here\n", "{out}");
        let mut py = session(Lang::Python);
        let out = call(&mut py, "x = 1\0");
        assert_eq!(out["error"], "exception", "{out}");
        assert!(
            out["message"].as_str().unwrap().contains("null bytes"),
            "{out}"
        );
        s.close().unwrap();
        py.close().unwrap();
    });
}
