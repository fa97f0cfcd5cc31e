//! The library used directly, as the HTTP server will: from many threads at once, and the
//! cgroup layer on its own.

use std::sync::{Arc, Barrier, Mutex};

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
                format!("run {i}\n2\n")
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
