//! The library used directly, as the HTTP server will: from many threads at once, and the
//! cgroup layer on its own.

use std::sync::{Arc, Barrier, Mutex};

use codecage::files::{InputFile, OutputRules};
use codecage::{Rootfs, Spec};

use super::common::*;

fn spec(argv: &[&str]) -> Spec {
    let mut spec = Spec::new(argv.iter().map(|s| s.to_string()).collect());
    spec.sandbox.rootfs = Rootfs::Host;
    // This test binary is not codecage: the sandbox's init is the real binary.
    spec.sandbox.init_exe = env!("CARGO_BIN_EXE_codecage").into();
    spec
}

/// Eight threads launch at the same moment while another thread holds a lock and
/// allocates: the child between clone3 and exec takes no lock and allocates nothing, so
/// nothing deadlocks, and every run gets its own output.
#[test]
fn runs_from_many_threads_at_once() {
    as_root(|| {
        in_process_launcher();
        let start = Arc::new(Barrier::new(9));
        let busy = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (busy, stop) = (busy.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut held = busy.lock().unwrap();
                    held.push(vec![0u8; 4096]);
                    if held.len() > 64 {
                        held.clear();
                    }
                }
            })
        };
        let workers: Vec<_> = (0..8)
            .map(|i| {
                let start = start.clone();
                std::thread::spawn(move || {
                    let spec = spec(&[
                        "bash",
                        "-c",
                        &format!("echo run {i}; cat /proc/self/uid_map | wc -l"),
                    ]);
                    start.wait();
                    codecage::run(&spec)
                })
            })
            .collect();
        start.wait();
        for (i, worker) in workers.into_iter().enumerate() {
            let outcome = worker.join().unwrap();
            assert_eq!(outcome.error, None, "{:?}", outcome.message);
            assert_eq!(
                String::from_utf8_lossy(&outcome.stdout),
                // Three ids mapped: root, the sandbox user, nobody.
                format!("run {i}\n3\n")
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
    });
}

/// A run cgroup whose launcher died (named after a pid that does not exist) is swept by
/// the next launcher.
#[test]
fn leftovers_of_a_dead_launcher_are_swept() {
    as_root(|| {
        let name = format!("run-{}-4194303-1-0", pid_namespace());
        let mut made = Vec::new();
        for dir in [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup",
        ] {
            let parent = std::path::Path::new(dir).join("codecage");
            if !std::path::Path::new(dir).join("cgroup.procs").exists() {
                continue;
            }
            let _ = std::fs::create_dir(&parent);
            let leftover = parent.join(&name);
            if std::fs::create_dir(&leftover).is_ok() {
                made.push(leftover);
            }
        }
        assert!(
            !made.is_empty(),
            "no cgroup hierarchy to plant a leftover in"
        );
        let run = run_json(&["--", "true"]);
        assert_eq!(run.error(), None, "{}", run.json);
        for leftover in &made {
            assert!(
                !leftover.exists(),
                "{} survived the sweep",
                leftover.display()
            );
        }
    });
}

/// A sandbox built ahead with Python pre-started (the warm pool's; here without a preload)
/// is answered at the interpreter's word on its end, before its exit: the script's status,
/// output and output files are exact, and when the Outcome comes nothing of the sandbox
/// runs any more (the init waits for each task's PF_EXITING in /proc, which every kernel
/// of the VM lanes must show), a child the script left included; the teardown after it
/// removes the rest.
#[test]
fn a_pre_started_python_is_answered_at_its_word_before_its_exit() {
    as_root(|| {
        in_process_launcher();
        let mark = marker("prestart-word");
        let mut built = spec(&["python3", "/work/main.py"]);
        built.exec.outputs = Some(OutputRules {
            dir: "out".into(),
            types: vec!["txt".into()],
            max_file: 1 << 20,
            max_total: 1 << 20,
            max_files: 10,
        });
        let prepared = codecage::launcher::Prepared::build(&built, Some(&[]))
            .unwrap_or_else(|e| panic!("{}", e.message));
        assert!(prepared.prestarted());
        let mut request = built.clone();
        request.exec.files = vec![InputFile::new(
            "main.py",
            format!(
                "import os, subprocess, sys\n\
                 os.makedirs('/work/out')\n\
                 open('/work/out/result.txt', 'w').write('forty-two')\n\
                 subprocess.Popen(['bash', '-c', 'exec -a {mark} sleep 600'])\n\
                 print('done')\n\
                 sys.exit(3)\n"
            ),
        )];
        let (mut outcome, teardown) = prepared.answer(&request, &mut |_, _| {}, None, None);
        let running = running_pids_with(&mark);
        teardown.finish_into(&mut outcome);
        assert_eq!(outcome.error, None, "{:?}", outcome.message);
        assert!(outcome.warm);
        assert_eq!(outcome.exit_code, Some(3), "{outcome:?}");
        assert_eq!(String::from_utf8_lossy(&outcome.stdout), "done\n");
        let files: Vec<(&str, Option<&[u8]>)> = outcome
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.data.as_deref()))
            .collect();
        assert_eq!(files, [("result.txt", Some(&b"forty-two"[..]))]);
        assert!(
            running.is_empty(),
            "the script's child ran on after the answer: {running:?}"
        );
        assert!(
            host_pids_with(&mark).is_empty(),
            "the teardown left the child"
        );
        // The word alone ends the run: a script that says it and sleeps on is killed at
        // once with the status it said (were the word not heard, the run would time out).
        let prepared = codecage::launcher::Prepared::build(&built, Some(&[]))
            .unwrap_or_else(|e| panic!("{}", e.message));
        let mut request = built.clone();
        request.exec.timeout = std::time::Duration::from_secs(600);
        request.exec.files = vec![InputFile::new(
            "main.py",
            "import os, time\nos.write(4, b'7\\n')\ntime.sleep(600)\n",
        )];
        let outcome = prepared.run(&request, &mut |_, _| {}, None, None);
        assert_eq!(outcome.error, None, "{:?}", outcome.message);
        assert_eq!(outcome.exit_code, Some(7), "{outcome:?}");
    });
}

/// What the init's wait after a word relies on, on this kernel: a killed process shows
/// PF_EXITING in the flags of /proc/PID/stat (field 9) from its exit on, zombie included,
/// and a live one does not.
#[test]
fn the_kernel_shows_a_killed_process_as_exiting() {
    let mark = marker("exiting-flag");
    let mut child = std::process::Command::new("bash")
        .args(["-c", &format!("exec -a {mark} sleep 600")])
        .spawn()
        .unwrap();
    let alive = wait_for(std::time::Duration::from_secs(10 * slowdown()), || {
        running_pids_with(&mark) == [child.id()]
    });
    assert!(alive, "the live child is not listed as running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // A zombie until reaped: waitid with WNOWAIT sees its end and leaves it.
    nix::sys::wait::waitid(
        nix::sys::wait::Id::Pid(nix::unistd::Pid::from_raw(child.id() as i32)),
        nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
    )
    .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    assert!(stat.contains(") Z "), "not a zombie: {stat}");
    assert!(
        running_pids_with(&mark).is_empty() && host_pids_with(&mark).is_empty(),
        "a zombie is neither running nor named (its cmdline is gone)"
    );
    let flags = task_flags(child.id()).unwrap();
    assert_ne!(flags & 0x4, 0, "PF_EXITING not shown: {stat}");
    child.wait().unwrap();
}

/// The child between clone3 and the init's exec runs in the launcher's own memory on a
/// stack of its own (CLONE_VM, on x86_64): each run's stack is unmapped once its child
/// has exec'd, so many runs leave the launcher's mappings as they were; and a child whose
/// exec fails still reports the step and the errno (its raw calls leave the launcher
/// thread's errno alone), and its stack is unmapped too.
#[test]
fn the_sandbox_child_leaves_no_stack_behind_and_reports_a_failed_exec() {
    as_root(|| {
        in_process_launcher();
        let mappings = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .count()
        };
        let not_executable = TempDir::new("init-not-executable");
        let fake_init = not_executable.path().join("codecage-init");
        std::fs::write(&fake_init, "not a program\n").unwrap();
        let mut failing = spec(&["true"]);
        failing.sandbox.init_exe = fake_init.clone();
        // Warm up: the allocator's arenas and the spawner thread are made once.
        for _ in 0..3 {
            assert_eq!(codecage::run(&spec(&["true"])).error, None);
            assert!(codecage::run(&failing).error.is_some());
        }
        let before = mappings();
        for _ in 0..20 {
            let outcome = codecage::run(&spec(&["true"]));
            assert_eq!(outcome.error, None, "{:?}", outcome.message);
            let failed = codecage::run(&failing);
            assert!(failed.error.is_some(), "{failed:?}");
            let message = failed.message.unwrap_or_default();
            assert!(
                message.contains("exec") && message.contains("Permission denied"),
                "the failed exec is named with its errno: {message}"
            );
        }
        let after = mappings();
        assert!(
            after <= before + 4,
            "40 runs left {} more mappings in the launcher ({before} -> {after})",
            after.saturating_sub(before)
        );
    });
}
