//! Nothing is left behind on any path: setup failure, SIGKILL of the payload, SIGKILL of
//! the launcher itself.

use std::time::Duration;

use super::common::*;

#[test]
fn a_setup_failure_is_typed_and_leaves_nothing() {
    as_root(|| {
        let (dir, run) = bash_in_minimal_rootfs(false, "echo never");
        assert_eq!(run.error(), Some("setup"), "{}", run.json);
        assert_eq!(run.status, 125);
        let message = run.json["message"].as_str().unwrap();
        assert!(
            message.contains("check_mount_points") && message.contains("ENOENT"),
            "{message}"
        );
        assert!(message.contains("/work"), "{message}");
        assert_eq!(run.stdout(), "");
        // The image directory is untouched: no mount point was created in it.
        assert!(!dir.path().join("work").exists());
    });
}

#[test]
fn a_missing_rootfs_is_refused_before_anything_is_built() {
    let run = run_json(&["--rootfs", "/nonexistent/codecage-image", "--", "true"]);
    assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
    assert!(run.json["message"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/codecage-image"));
    assert_eq!(run.status, 125);
}

#[test]
fn sigkill_of_the_payload_leaves_nothing() {
    as_root(|| {
        let mark = marker("kill9");
        let script = format!("(exec -a {mark}-child sleep 100) & exec -a {mark} sleep 100");
        let mut child = spawn_bash(&["--timeout", "20"], &script);
        wait_for_marks(&mut child, &mark, 2);
        // The payload itself is the one named exactly `mark`; its child is `mark-child`.
        let target = host_pids_with(&format!("{mark}\0"))[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(target as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let run = finish(child);
        assert_eq!(run.json["signal"], 9, "{}", run.json);
        assert_eq!(run.status, 137);
    });
}

/// Also setsid'd processes, which left the launcher's session; the launcher's cgroups,
/// which it cannot remove once killed, go with the next launcher's sweep.
#[test]
fn sigkill_of_the_launcher_takes_the_sandbox_with_it_and_its_cgroups_are_swept() {
    as_root(|| {
        let mark = marker("launcher");
        let mut child = codecage_run()
            .args(["--timeout", "60", "--", "bash", "-c"])
            .arg(format!(
                "(setsid bash -c 'exec -a {mark} sleep 100' &); exec -a {mark} sleep 100"
            ))
            .launch();
        wait_for_marks(&mut child, &mark, 2);
        kill_launcher(&mut child, &mark);
    });
}

/// A launcher in another pid namespace (a container) cannot tell whether this one is alive
/// from its pids, so it leaves this one's cgroups alone: the run here is not swept away.
#[test]
fn a_launcher_in_another_pid_namespace_does_not_sweep_live_runs() {
    as_root(|| {
        let host_run = spawn_bash(&["--timeout", &secs(20)], "sleep 2; echo survived");
        std::thread::sleep(Duration::from_millis(500 * slowdown()));
        // The host check cannot look for that run's cgroups: they are named after a pid of
        // its own namespace (see run_cgroups); that launcher exits normally and removes them.
        let other = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount-proc",
                env!("CARGO_BIN_EXE_codecage"),
                "run",
                "--rootfs",
                "host",
                "--",
                "true",
            ])
            .launch()
            .wait()
            .unwrap();
        assert!(other.success());
        let run = finish(host_run);
        assert_eq!(run.stdout(), "survived\n", "{}", run.json);
        assert_eq!(run.error(), None);
    });
}
