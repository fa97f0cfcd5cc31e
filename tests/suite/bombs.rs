//! The bomb suite: each bomb runs inside codecage under a small limit, then the host is
//! checked (no process, cgroup or mount left: [`as_root`]).
//! The same tests run on the native (v1/hybrid) host and in the cgroup v2 VM
//! (`cargo xtask vm-test`).

use std::time::Duration;

use super::common::*;

/// Runs a bomb with `flags` and `argv`, named by a marker so that the host check after the
/// test finds any of its processes left (forked copies keep argv[0]).
/// Whether the bomb ended before its timeout is the verdict's to say (`oom`,
/// `output_limit`, an exit), never a stopwatch's.
fn bomb(name: &str, flags: &[&str], argv: &[&str]) -> Run {
    let marked = marked(&marker(name), argv);
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(marked.iter().map(String::as_str));
    run_json(&args)
}

fn python(code: &str) -> Vec<&str> {
    vec!["python3", "-c", code]
}

/// A bash fork bomb fills its pids limit and goes no further, and the sandbox ends at its
/// timeout with every copy of the bomb. What is asserted holds however loaded the machine
/// is: while the bomb runs, the host sees the run's pids cgroup at its limit (the kernel's
/// `pids.events`) and can still start a process of its own; the run ends by its timeout
/// (the payload turns into a sleep by exec, which needs no fork, so it neither ends early
/// nor depends on bash's `fork: retry` succeeding in time); the outcome counts the refused
/// forks; the host check after the test finds no copy left.
#[test]
fn bash_fork_bomb_is_contained() {
    as_root(|| {
        let mark = marker("forkbomb");
        let timeout = secs(5);
        let argv = marked(
            &mark,
            &["bash", "-c", ":(){ :|:& };:; exec -a \"$0\" sleep 1000"],
        );
        let mut child = codecage_run()
            .args(["--json", "--pids", "32", "--timeout", &timeout])
            .args(&argv)
            .stdout(std::process::Stdio::piped())
            .launch();
        // Until the run ends (at its timeout at the latest): the limit seen from the host.
        let mut at_limit = None;
        while at_limit.is_none() && child.try_wait().unwrap().is_none() {
            at_limit = run_pids_cgroup(child.id())
                .filter(|dir| read_keyed(&dir.join("pids.events"), "max").is_some_and(|n| n > 0));
            std::thread::sleep(Duration::from_millis(20));
        }
        let dir = at_limit.expect("the host never saw the bomb at its pids limit");
        let max = std::fs::read_to_string(dir.join("pids.max")).unwrap();
        assert_eq!(max.trim(), "33", "32 for the payload, 1 for the init");
        let host = std::process::Command::new("true").status();
        assert!(
            host.as_ref().is_ok_and(|s| s.success()),
            "the host could not start a process while the bomb ran: {host:?}"
        );
        let run = finish(child);
        assert_eq!(run.error(), Some("timeout"), "{}", run.json);
        assert_eq!(run.status, 124, "{}", run.json);
        assert!(
            run.json["duration_ms"].as_f64().unwrap() >= seconds(&timeout) * 1000.0,
            "ended before its timeout: {}",
            run.json
        );
        assert!(
            run.json["pids_limit_hit"].as_bool().unwrap(),
            "{}",
            run.json
        );
    });
}

/// The seconds of a [`secs`] value (`"10s"`).
fn seconds(value: &str) -> f64 {
    value.trim_end_matches('s').parse().unwrap()
}

/// The pids cgroup of the run whose launcher is `launcher` (the directory with a
/// `pids.max`), while it exists.
fn run_pids_cgroup(launcher: u32) -> Option<std::path::PathBuf> {
    run_cgroups()
        .into_iter()
        .filter(|(pid, _)| *pid == launcher)
        .map(|(_, dir)| dir)
        .find(|dir| dir.join("pids.max").exists())
}

/// The value of `key` in a "key value" per line file (pids.events, ...).
fn read_keyed(path: &std::path::Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
}

#[test]
fn python_fork_loop_meets_eagain() {
    as_root(|| {
        let code = "import os, time\n\
            for i in range(1000):\n\
            \x20   try:\n\
            \x20       if os.fork() == 0:\n\
            \x20           time.sleep(30); os._exit(0)\n\
            \x20   except OSError as e:\n\
            \x20       print('fork failed', e.errno, 'after', i); break\n";
        let run = bomb(
            "pyfork",
            &["--pids", "16", "--timeout", "20"],
            &python(code),
        );
        assert!(
            run.stdout().starts_with("fork failed 11 after"),
            "{}",
            run.json
        );
        let forks: u32 = run
            .stdout()
            .trim()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((10..16).contains(&forks), "{}", run.json);
        assert!(run.json["pids_limit_hit"].as_bool().unwrap());
        assert_eq!(run.exit_code(), Some(0));
    });
}

#[test]
fn node_spawn_loop_meets_eagain() {
    as_root(|| {
        let code = "const { spawn } = require('child_process'); let n = 0;\n\
            function go() { const c = spawn('sleep', ['30']);\n\
            c.on('error', e => { console.log('spawn failed', e.code); process.exit(0); });\n\
            c.on('spawn', () => { n++; if (n > 500) { console.log('no limit'); process.exit(1); } go(); }); }\n\
            go();";
        let run = bomb(
            "nodespawn",
            &["--pids", "40", "--timeout", "60", "--memory", "512M"],
            &["node", "-e", code],
        );
        assert_eq!(run.stdout(), "spawn failed EAGAIN\n", "{}", run.json);
        assert!(run.json["pids_limit_hit"].as_bool().unwrap());
    });
}

#[test]
fn thread_bomb_is_contained() {
    as_root(|| {
        let code = "import threading, time\n\
            n = 0\n\
            try:\n\
            \x20   while n < 10000:\n\
            \x20       threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n\
            except RuntimeError as e:\n\
            \x20   print('thread failed after', n)\n";
        let run = bomb(
            "threads",
            &["--pids", "24", "--timeout", "20"],
            &python(code),
        );
        assert!(
            run.stdout().starts_with("thread failed after"),
            "{}",
            run.json
        );
        assert!(run.json["pids_limit_hit"].as_bool().unwrap());
    });
}

#[test]
fn python_memory_bomb_is_oom_killed_at_the_limit() {
    as_root(|| {
        let code =
            "x = []\nwhile True:\n    x.append(bytearray(8 << 20)); print(len(x) * 8, flush=True)";
        let run = bomb(
            "pymem",
            &["--memory", "64M", "--timeout", "30"],
            &python(code),
        );
        assert_eq!(run.error(), Some("oom"), "{}", run.json);
        assert_eq!(run.status, 137);
        assert!(
            run.json["message"].as_str().unwrap().contains("64M"),
            "{}",
            run.json
        );
        let peak = run.json["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak <= 64 << 20 && peak > 32 << 20, "peak {peak}");
        // Partial output is kept.
        assert!(run.stdout().starts_with("8\n16\n"), "{}", run.json);
    });
}

#[test]
fn node_buffer_bomb_is_oom_killed() {
    as_root(|| {
        let code =
            "const b = []; for (;;) { b.push(Buffer.alloc(16 << 20, 1)); console.log(b.length * 16); }";
        let run = bomb(
            "nodemem",
            &["--memory", "160M", "--timeout", "60"],
            &["node", "-e", code],
        );
        assert_eq!(run.error(), Some("oom"), "{}", run.json);
        assert!(run.json["peak_memory_bytes"].as_u64().unwrap() <= 160 << 20);
    });
}

#[test]
fn memory_bomb_across_threads_is_oom_killed() {
    as_root(|| {
        let code = "import threading, time\n\
            hold = []\n\
            def eat():\n\
            \x20   for _ in range(64): hold.append(bytearray(4 << 20)); time.sleep(0.001)\n\
            ts = [threading.Thread(target=eat) for _ in range(8)]\n\
            [t.start() for t in ts]; [t.join() for t in ts]\n\
            print('survived', len(hold))";
        let run = bomb(
            "threadmem",
            &["--memory", "64M", "--timeout", "30"],
            &python(code),
        );
        assert_eq!(run.error(), Some("oom"), "{}", run.json);
        assert!(!run.stdout().contains("survived"), "{}", run.json);
    });
}

/// Children each take a slice; the OOM killer takes some of them. The payload itself
/// survives and ends the run by itself: the verdict is its exit, and the OOM kills are
/// counted beside it. Each child holds its slice until every child has taken its own or
/// died (pipes, not sleeps): the 8 slices are held at once however slowly they come.
#[test]
fn oom_kills_of_children_are_counted_when_the_parent_survives() {
    as_root(|| {
        // Each child asks for more than the whole limit by itself, so each one is the
        // largest process when its cgroup runs out and is killed, however the children's
        // allocations interleave and however loaded the machine is; the parent stays
        // small and survives. (Children that held 24 MiB each at once left the kernel
        // free to pick the parent on a v1 host.)
        let code = "import os\n\
            kids = []\n\
            for i in range(8):\n\
            \x20   pid = os.fork()\n\
            \x20   if pid == 0:\n\
            \x20       x = bytearray(120 << 20); os._exit(0)\n\
            \x20   kids.append(pid)\n\
            codes = [os.waitpid(k, 0)[1] for k in kids]\n\
            print('killed', sum(1 for c in codes if os.WIFSIGNALED(c)))";
        let run = bomb(
            "forkmem",
            &["--memory", "96M", "--timeout", "30"],
            &python(code),
        );
        assert_eq!(run.error(), None, "{}", run.json);
        assert_eq!(run.exit_code(), Some(0), "{}", run.json);
        let killed: u64 = run
            .stdout()
            .strip_prefix("killed ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("the parent survived and reported: {}", run.json));
        assert_eq!(killed, 8, "{}", run.json);
        assert_eq!(run.json["oom_kills"].as_u64(), Some(killed), "{}", run.json);
    });
}

#[test]
fn cpu_spin_gets_half_a_cpu() {
    as_root(|| {
        // Two spinning processes, 3 s of wall time, --cpus 0.5: at most 1.5 s of CPU in all.
        let run = bomb(
            "spin",
            &["--cpus", "0.5", "--timeout", "3"],
            &["bash", "-c", "while :; do :; done & while :; do :; done"],
        );
        assert_eq!(run.error(), Some("timeout"), "{}", run.json);
        let cpu = run.json["cpu_ms"].as_f64().unwrap();
        let wall = run.json["duration_ms"].as_f64().unwrap();
        // The quota is a ceiling: at most 50 ms per 100 ms period, whatever the load (a
        // loaded machine may give less; how much less is not the sandbox's to promise),
        // with one period of slack for the edges of the run.
        assert!(cpu > 0.0, "{}", run.json);
        assert!(
            cpu <= 0.5 * wall + 100.0,
            "cpu {cpu} ms over {wall} ms = {:.2} CPUs, over the 0.5 asked",
            cpu / wall
        );
    });
}

#[test]
fn disk_bomb_meets_enospc_at_the_tmpfs_size() {
    as_root(|| {
        // Data and inodes: a big file, then a flood of empty files (from one process: a
        // shell forking `touch` 2000 times is slow under the VM lane's emulated CPU).
        let script = "head -c 100M /dev/zero > /tmp/big 2>/dev/null; echo tmp $?; \
                      head -c 100M /dev/zero > /work/big 2>/dev/null; echo work $?; rm -f /tmp/big /work/big; \
                      python3 -c \"
import errno
i = 0
try:
    while True:
        open(f'/tmp/f{i}', 'w').close(); i += 1
except OSError as e:
    print('files', i, errno.errorcode[e.errno])\"";
        let run = bomb(
            "disk",
            &["--tmp-size", "8M", "--work-size", "8M", "--timeout", "60"],
            &["bash", "-c", script],
        );
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert_eq!(lines[..2], ["tmp 1", "work 1"], "{}", run.json);
        let (files, why) = lines[2]
            .strip_prefix("files ")
            .unwrap()
            .split_once(' ')
            .unwrap();
        let files: u64 = files.parse().unwrap();
        assert_eq!(why, "ENOSPC", "{}", run.json);
        assert!((1000..=2100).contains(&files), "inode cap: {files} files");
    });
}

#[test]
fn stdout_and_stderr_floods_stop_at_the_cap() {
    as_root(|| {
        let run = bomb(
            "flood",
            &["--output-limit", "256K", "--timeout", "20"],
            &["bash", "-c", "cat /dev/urandom >&2 & yes"],
        );
        assert_eq!(run.error(), Some("output_limit"), "{}", run.json);
    });
}

#[test]
fn fd_exhaustion_stays_inside() {
    as_root(|| {
        let code = "fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError as e:\n    print('open failed', e.errno)";
        let run = bomb("fds", &["--timeout", "20"], &python(code));
        assert_eq!(run.stdout(), "open failed 24\n", "{}", run.json);
    });
}

#[test]
fn zombie_pile_up_is_reaped() {
    as_root(|| {
        // Children exit at once and are never waited for: zombies fill the pids limit, then
        // the payload exits and the init reaps them all.
        let code = "import os\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0: os._exit(0)\n        n += 1\n\
                    except OSError as e:\n    print('zombies', n >= 10, e.errno)";
        let run = bomb(
            "zombies",
            &["--pids", "16", "--timeout", "20"],
            &python(code),
        );
        assert_eq!(run.stdout(), "zombies True 11\n", "{}", run.json);
        assert!(run.json["pids_limit_hit"].as_bool().unwrap());
    });
}

#[test]
fn bad_limit_values_are_refused() {
    for (flag, value, needle) in [
        ("--memory", "12Q", "256M"),
        ("--cpus", "-1", "0.5"),
        ("--pids", "0", "64"),
        ("--memory", "1M", "from 8M"),
    ] {
        let out = codecage_run()
            .args([flag, value, "--", "true"])
            .launch_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flag} {value}: {stderr}");
        assert!(stderr.contains(needle), "{flag} {value}: {stderr}");
        if flag != "--memory" || value != "1M" {
            assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        }
    }
}

#[test]
fn the_cgroup_layout_is_the_expected_one_and_every_limit_is_enforceable() {
    as_root(|| {
        let out = codecage().args(["doctor", "--json"]).launch_output();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Ok(expected) = std::env::var("CODECAGE_TEST_LAYOUT") {
            assert_eq!(report["cgroup_layout"], expected.as_str(), "{report}");
        }
        // Every limit and every layer works here, but landlock where the kernel has none
        // (the no-landlock lane): doctor says so, and its status says something failed.
        let landlock = kernel_landlock_abi().is_some();
        for check in report["checks"].as_array().unwrap() {
            let ok = landlock || check["name"] != "landlock";
            assert_eq!(check["ok"], ok, "{check}");
        }
        assert_eq!(out.status.code(), Some(if landlock { 0 } else { 1 }));
        // What stops a sandbox is what this kernel has: cgroup.kill only where a cgroup2
        // cgroup offers it (Linux 5.14), a SIGKILL of each process elsewhere.
        let kill = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "kill and placement")
            .unwrap()["detail"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(kill.contains("SIGKILL of the pid-namespace init"), "{kill}");
        let has_kill = kernel_has_cgroup_kill();
        assert_eq!(
            kill.contains("emptied with cgroup.kill"),
            has_kill,
            "{kill}"
        );
        assert_eq!(
            kill.contains("by SIGKILL to each process it lists"),
            !has_kill,
            "{kill}"
        );
    });
}

/// Whether this kernel gives cgroup2 cgroups a `cgroup.kill` (Linux 5.14): looked for in a
/// cgroup of the test's own, made below the cgroup2 mount's `codecage` parent (cgroups
/// only there; a name no launcher sweeps and no host check counts) and removed (the root
/// has none). No cgroup2 mount (pure v1): false.
fn kernel_has_cgroup_kill() -> bool {
    let Some(unified) = host_mounts().into_iter().find(|m| m.fs_type == "cgroup2") else {
        return false;
    };
    let parent = std::path::Path::new(&unified.mount_point).join("codecage");
    std::fs::create_dir_all(&parent).unwrap();
    let probe = parent.join(format!("ccprobe-kill-{}", std::process::id()));
    std::fs::create_dir(&probe).unwrap();
    let has_kill = probe.join("cgroup.kill").exists();
    std::fs::remove_dir(&probe).unwrap();
    has_kill
}

/// Memory that belongs to no process (a tmpfs file) pushes the sandbox over its limit: the
/// OOM killer takes a payload process (oom_score_adj 1000), and even if it took the init,
/// the run says `oom`, not `setup`.
#[test]
fn a_tmpfs_memory_bomb_is_reported_as_oom() {
    as_root(|| {
        let run = bomb(
            "shmbomb",
            &["--memory", "16M", "--timeout", &secs(20)],
            &["sh", "-c", "head -c 30000000 /dev/zero > /dev/shm/x"],
        );
        assert_eq!(run.error(), Some("oom"), "{}", run.json);
        assert_eq!(run.status, 137);
    });
}
