//! The run contract: languages, exit statuses, streams, stdin, environment, JSON.

use super::common::*;

#[test]
fn hello_world_in_python() {
    as_root(|| {
        let run = run_json(&["--lang", "python", "-c", "print('hello from python')"]);
        assert_eq!(run.stdout(), "hello from python\n", "{}", run.json);
        assert_eq!((run.exit_code(), run.status), (Some(0), 0));
    });
}

#[test]
fn hello_world_in_node() {
    as_root(|| {
        let run = run_json(&["--lang", "node", "-c", "console.log('hello from node')"]);
        assert_eq!(run.stdout(), "hello from node\n", "{}", run.json);
        assert_eq!(run.status, 0);
    });
}

#[test]
fn hello_world_in_bash() {
    as_root(|| {
        let run = run_json(&["--lang", "bash", "-c", "echo hello from ${0%.sh}"]);
        // The code runs from a file in /work, so $0 is its name.
        assert_eq!(run.stdout(), "hello from main\n", "{}", run.json);
        assert_eq!(run.status, 0);
    });
}

#[test]
fn a_file_runs_in_the_language_of_its_extension() {
    as_root(|| {
        let dir = TempDir::new("file");
        let file = dir.path().join("script.py");
        std::fs::write(
            &file,
            "import sys\nprint('from file', sys.version_info[0])\n",
        )
        .unwrap();
        let run = run_json(&[file.to_str().unwrap()]);
        assert_eq!(run.stdout(), "from file 3\n", "{}", run.json);
    });
}

#[test]
fn exit_status_is_the_payloads_own() {
    as_root(|| {
        let run = bash(&[], "exit 3");
        assert_eq!(
            (run.exit_code(), run.status, run.error()),
            (Some(3), 3, None)
        );
        let plain = codecage_run()
            .args(["--", "bash", "-c", "exit 42"])
            .launch()
            .wait()
            .unwrap();
        assert_eq!(plain.code(), Some(42));
    });
}

#[test]
fn death_by_signal_is_128_plus_n() {
    as_root(|| {
        let run = bash(&[], "kill -TERM $$");
        assert_eq!(run.json["signal"], 15, "{}", run.json);
        assert_eq!(run.json["exit_code"], serde_json::Value::Null);
        assert_eq!(run.status, 128 + 15);
    });
}

#[test]
fn stderr_is_captured_separately() {
    as_root(|| {
        let run = bash(&[], "echo to-out; echo to-err >&2; echo more-out");
        assert_eq!(run.stdout(), "to-out\nmore-out\n");
        assert_eq!(run.stderr_field(), "to-err\n");
        // Without --json the streams pass through to the CLI's own stdout and stderr.
        let out = codecage_run()
            .args(["--", "bash", "-c", "echo o; echo e >&2"])
            .launch_output();
        assert_eq!(
            (out.stdout.as_slice(), out.stderr.as_slice()),
            (&b"o\n"[..], &b"e\n"[..])
        );
    });
}

#[test]
fn stdin_is_at_eof() {
    as_root(|| {
        // Even when the caller's stdin is a pipe that never closes, the payload reads EOF.
        let mut child = codecage_run()
            .args(["--json", "--timeout", "10", "--lang", "python", "-c"])
            .arg("import sys; d = sys.stdin.read(); print(repr(d))")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .launch();
        let _keep_open = child.stdin.take();
        let run = finish(child);
        assert_eq!(run.stdout(), "''\n", "{}", run.json);
        assert_eq!(run.error(), None);
    });
}

#[test]
fn a_missing_program_is_127_and_a_non_executable_one_126() {
    as_root(|| {
        let run = run_json(&["--", "no-such-program-xyz"]);
        assert_eq!(run.status, 127, "{}", run.json);
        assert!(
            run.stderr_field().contains("no-such-program-xyz"),
            "{}",
            run.json
        );
        let run = run_json(&["--", "/etc/passwd"]);
        assert_eq!(run.status, 126, "{}", run.json);
    });
}

#[test]
fn the_environment_is_clean() {
    as_root(|| {
        let output = codecage_run()
            .env("CODECAGE_TEST_SECRET", "hunter2")
            .args(["--json", "--env", "FOO=bar", "--", "env"])
            .launch_output();
        let run = parse(output);
        let mut vars: Vec<&str> = run.stdout().lines().collect();
        vars.sort();
        assert_eq!(
            vars,
            [
                "FOO=bar",
                "HOME=/work",
                "LANG=C.UTF-8",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            ]
        );
    });
}

#[test]
fn the_working_directory_is_work() {
    as_root(|| {
        assert_eq!(run_json(&["--", "pwd"]).stdout(), "/work\n");
    });
}

#[test]
fn json_carries_every_documented_field() {
    as_root(|| {
        let run = bash(&[], "echo hi");
        for key in [
            "stdout",
            "stderr",
            "exit_code",
            "signal",
            "error",
            "message",
            "truncated",
            "duration_ms",
            "cpu_ms",
            "peak_memory_bytes",
        ] {
            assert!(run.json.get(key).is_some(), "missing {key} in {}", run.json);
        }
        assert!(run.json["duration_ms"].as_f64().unwrap() > 0.0);
        assert!(run.json["peak_memory_bytes"].as_u64().unwrap() > 0);
    });
}

#[test]
fn bad_flag_values_are_refused_with_a_message_and_125() {
    // No root needed: these never reach the launcher.
    for (args, needle) in [
        (vec!["--timeout", "abc"], "--timeout"),
        (vec!["--output-limit", "12Q"], "--output-limit"),
        (vec!["--tmp-size", "0"], "--tmp-size"),
    ] {
        let mut all = vec!["run"];
        all.extend(&args);
        all.extend(["--", "true"]);
        let out = codecage().args(&all).launch_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle) && (stderr.contains("256M") || stderr.contains("500ms")),
            "{args:?}: {stderr}"
        );
        // With --json: one object, error invalid_request, a message naming the flag.
        let mut all = vec!["run", "--json"];
        all.extend(&args);
        all.extend(["--", "true"]);
        let run = parse(codecage().args(&all).launch_output());
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(
            run.json["message"].as_str().unwrap().contains(needle),
            "{}",
            run.json
        );
        assert_eq!(run.status, 125);
    }
    let run = parse(
        codecage_run()
            .args(["--json", "-c", "print(1)"])
            .launch_output(),
    );
    assert!(
        run.json["message"].as_str().unwrap().contains("--lang"),
        "{}",
        run.json
    );
}
