//! Wall-clock timeout, output cap and signal forwarding.

use std::time::Duration;

use super::common::*;

#[test]
fn a_timeout_kills_a_double_forked_setsid_child_that_ignores_sigterm() {
    as_root(|| {
        let mark = marker("timeout");
        let script = format!(
            "echo before; (setsid bash -c 'trap \"\" TERM; exec -a {mark} sleep 1000' &); \
             trap '' TERM; exec -a {mark}-parent sleep 1000"
        );
        let timeout = secs(1);
        let run = bash(&["--timeout", &timeout], &script);
        // Dead when codecage returned, not merely later.
        let left = host_pids_with(&mark);
        assert!(left.is_empty(), "outlived the timeout: {left:?}");
        assert_eq!(run.error(), Some("timeout"), "{}", run.json);
        assert_eq!(run.status, 124);
        assert_eq!(run.stdout(), "before\n", "partial output is kept");
        assert!(
            run.json["message"].as_str().unwrap().contains(&timeout),
            "{}",
            run.json
        );
        // Ended by its timeout, not before: how long after is the machine's load, not asserted.
        let limit_ms = timeout.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0;
        assert!(
            run.json["duration_ms"].as_f64().unwrap() >= limit_ms,
            "{}",
            run.json
        );
    });
}

#[test]
fn the_output_cap_stops_yes_at_exactly_the_limit() {
    as_root(|| {
        let run = run_json(&["--", "yes"]);
        assert_eq!(
            run.error(),
            Some("output_limit"),
            "{}",
            &run.json["message"]
        );
        assert_eq!(run.json["truncated"], true);
        assert_eq!(run.stdout().len(), 1 << 20);
        assert!(run.stdout().starts_with("y\ny\n"));
        assert_eq!(run.status, 137);
        // stdout and stderr share the cap.
        let run = bash(&["--output-limit", "64K"], "yes out & yes err >&2");
        assert_eq!(run.error(), Some("output_limit"));
        assert_eq!(run.stdout().len() + run.stderr_field().len(), 64 << 10);
        // Exactly at the limit is not over it.
        let run = bash(&["--output-limit", "4"], "printf abcd");
        assert_eq!(
            (run.stdout(), run.error(), run.json["truncated"].as_bool()),
            ("abcd", None, Some(false))
        );
    });
}

#[test]
fn output_flows_without_blocking_the_payload() {
    as_root(|| {
        // 512 KiB on each stream at once: more than a pipe buffer, so a launcher that drained
        // one stream at a time would deadlock.
        let run = bash(&["--output-limit", "2M"], "head -c 524288 /dev/zero | tr '\\0' o & head -c 524288 /dev/zero | tr '\\0' e >&2; wait; echo");
        assert_eq!(run.error(), None, "{}", run.json["message"]);
        assert_eq!(run.stdout().len(), 524288 + 1);
        assert_eq!(run.stderr_field().len(), 524288);
    });
}

#[test]
fn sigterm_to_codecage_reaches_the_payload() {
    as_root(|| {
        let mark = marker("term");
        let script = format!(
            "trap 'echo got-term; exit 7' TERM; echo ready; exec -a {mark} sleep 100 & wait"
        );
        // The signal goes once the payload is ready, however long that takes here: the
        // only deadline is the sandbox's own timeout, which would end the run first.
        let mut child = spawn_bash(&["--timeout", &secs(60)], &script);
        wait_for_marks(&mut child, &mark, 1);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let run = finish(child);
        assert_eq!(run.stdout(), "ready\ngot-term\n", "{}", run.json);
        assert_eq!(run.exit_code(), Some(7));
    });
}

/// A reader of codecage's stdout that never reads does not stop the timeout.
#[test]
fn a_stalled_reader_of_the_output_does_not_stop_the_timeout() {
    as_root(|| {
        let mark = marker("stalled");
        let mut child = codecage_run()
            .args(["--timeout", &secs(3), "--", "bash", "-c"])
            .arg(format!(
                "head -c 300000 /dev/zero; exec -a {mark} sleep 3600"
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .launch();
        // Nobody reads the pipe (300 kB is more than it holds). The launcher drains the
        // payload whatever its reader does, so the payload gets past its output: seen here
        // while it sleeps (a launcher that stalled it would hang this loop until nextest's
        // slow-timeout fails the test).
        wait_for_marks(&mut child, &mark, 1);
        // Then its timeout ends it, still unread. Left alone it would sleep an hour; the
        // deadline, under nextest's 5-minute stop, is 80 times the timeout (8 in the VM
        // lane): it tells a timeout that acted from one that did not, not a fast machine.
        let gone = wait_for(Duration::from_secs(240), || {
            host_pids_with(&mark).is_empty()
        });
        let left = host_pids_with(&mark);
        drop(child.stdout.take());
        let status = child.wait().unwrap();
        assert!(
            gone,
            "the payload outlived its timeout while the output was stalled: {left:?}"
        );
        assert_eq!(status.code(), Some(124));
    });
}
