//! The second hardening pass: the host's facts stay out of /proc, TCP cannot be opened
//! around landlock, verdicts name what ended a run, output survives any bytes, and the CLI
//! trusts only what it should.

use super::common::*;

#[test]
fn proc_tells_the_sandboxs_memory_and_cpu_count_not_the_hosts() {
    as_root(|| {
        let run = bash(
            &["--memory", "96M", "--cpus", "0.5"],
            "grep MemTotal /proc/meminfo; grep -c ^processor /proc/cpuinfo; grep -c '^cpu[0-9]' /proc/stat; \
             python3 -c 'import os; print(os.cpu_count())'; \
             node -e 'const os = require(\"os\"); console.log(os.cpus().length, os.totalmem())'",
        );
        assert_eq!(
            run.stdout(),
            "MemTotal:          98304 kB\n1\n1\n1\n1 100663296\n",
            "{}",
            run.json
        );
    });
}

#[test]
fn proc_entries_that_describe_the_host_are_empty() {
    as_root(|| {
        let host_boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let run = bash(
            &[],
            "for f in cmdline config.gz keys key-users locks interrupts softirqs diskstats partitions \
             swaps zoneinfo buddyinfo vmstat iomem ioports kallsyms consoles dma; do \
               [ -e /proc/$f ] && printf '%s=%s ' $f $(wc -c < /proc/$f); done; echo; \
             ls -A /proc/pressure /proc/acpi /proc/driver | grep -v ':$' | grep -c . ; \
             cat /proc/loadavg; cat /proc/sys/kernel/random/boot_id; \
             echo x > /proc/meminfo 2>&1 || echo read-only",
        );
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert!(lines.len() >= 5, "{}", run.json);
        for entry in lines[0].split_whitespace() {
            assert!(entry.ends_with("=0"), "/proc/{entry} bytes: {}", run.json);
        }
        assert_eq!(
            lines[1], "0",
            "pressure, acpi and driver list nothing: {}",
            run.json
        );
        assert_eq!(lines[2], "0.00 0.00 0.00 1/1 1", "{}", run.json);
        assert_ne!(lines[3], host_boot_id.trim(), "the host's boot id");
        assert_eq!(lines[3].len(), 36);
        assert_eq!(lines[4], "read-only", "{}", run.json);
    });
}

/// TCP Fast Open stays off in the sandbox's network namespace, so connect(2) is the only
/// way a TCP connection opens (landlock's connect rule would see nothing else, should a
/// network mode handle TCP again), and a sendto(MSG_FASTOPEN) aimed at a port the host
/// listens on reaches nothing outside the namespace: loopback TCP is the sandbox's own.
#[test]
fn tcp_fast_open_is_off_and_reaches_nothing_outside_the_namespace() {
    as_root(|| {
        let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        host.set_nonblocking(true).unwrap();
        let port = host.local_addr().unwrap().port();
        let code = format!(
            "import socket, errno\n\
             c = socket.socket()\n\
             try:\n\
             \x20   c.sendto(b'hi', 0x20000000, ('127.0.0.1', {port})); print('sent')\n\
             except OSError as e:\n\
             \x20   print('refused', errno.errorcode[e.errno])\n\
             print(open('/proc/sys/net/ipv4/tcp_fastopen').read().strip())"
        );
        let run = run_json(&["--", "python3", "-c", &code]);
        // The namespace's own 127.0.0.1 has nothing on that port.
        assert!(run.stdout().starts_with("refused "), "{}", run.json);
        assert!(run.stdout().ends_with("\n0\n"), "{}", run.json);
        assert!(
            host.accept().is_err(),
            "the host's listener got a connection"
        );
    });
}

#[test]
fn a_timeout_after_an_oom_kill_is_a_timeout_with_the_kill_counted() {
    as_root(|| {
        let code = "import os, time\n\
            pid = os.fork()\n\
            if pid == 0:\n\
            \x20   x = bytearray(200 << 20); os._exit(0)\n\
            os.waitpid(pid, 0); print('child gone', flush=True)\n\
            time.sleep(60)";
        let run = run_json(&[
            "--memory",
            "64M",
            "--timeout",
            &secs(3),
            "--",
            "python3",
            "-c",
            code,
        ]);
        assert_eq!(run.error(), Some("timeout"), "{}", run.json);
        assert_eq!(run.status, 124);
        assert_eq!(run.json["oom_kills"].as_u64(), Some(1), "{}", run.json);
        assert_eq!(run.stdout(), "child gone\n");
    });
}

#[test]
fn code_larger_than_work_is_refused_before_anything_runs() {
    as_root(|| {
        let dir = TempDir::new("bigcode");
        let file = dir.path().join("big.py");
        std::fs::write(&file, "x = 1\n".repeat(200_000)).unwrap();
        let run = run_json(&["--work-size", "1M", file.to_str().unwrap()]);
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(
            run.json["message"]
                .as_str()
                .unwrap()
                .contains("/work holds (1M)"),
            "{}",
            run.json
        );
    });
}

#[test]
fn output_that_is_not_text_comes_back_exactly() {
    as_root(|| {
        use base64::Engine as _;
        let run = bash(&[], "printf 'a\\377\\000b'; head -c 100000 /dev/zero >&2");
        assert_eq!(run.json["stdout_encoding"], "base64", "{}", run.json);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(run.stdout())
            .unwrap();
        assert_eq!(bytes, b"a\xff\x00b");
        assert_eq!(run.json["stderr_encoding"], "base64");
        let json_len = run.json.to_string().len();
        assert!(
            json_len < 100_000 * 4 / 3 + 2048,
            "{json_len} bytes of JSON"
        );
        let run = bash(&[], "echo plain text");
        assert_eq!(run.json["stdout_encoding"], "utf-8");
        assert_eq!(run.stdout(), "plain text\n");
    });
}

/// `--pids N`: N processes and threads of the code's own; the sandbox's init is not one
/// of them. One is enough for a program that does not fork.
#[test]
fn pids_n_means_n_processes_of_the_code() {
    as_root(|| {
        let run = run_json(&["--pids", "1", "--", "true"]);
        assert_eq!(run.error(), None, "{}", run.json);
        assert_eq!(run.exit_code(), Some(0));
        let code = "import os, time\n\
            n = 1\n\
            try:\n\
            \x20   while True:\n\
            \x20       if os.fork() == 0: time.sleep(5); os._exit(0)\n\
            \x20       n += 1\n\
            except OSError: print(n)";
        let run = run_json(&["--pids", "5", "--", "python3", "-c", code]);
        assert_eq!(run.stdout(), "5\n", "{}", run.json);
    });
}

#[test]
fn a_bare_env_name_is_refused_not_copied_from_the_launcher() {
    as_root(|| {
        let out = codecage_run()
            .env("CODECAGE_TEST_SECRET", "hunter2")
            .args(["--json", "--env", "CODECAGE_TEST_SECRET", "--", "env"])
            .launch_output();
        let run = parse(out);
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(!run.json.to_string().contains("hunter2"));
    });
}

/// Through sudo, codecage acts for the invoking user: it reads FILE as that user, and the
/// profile and image come from what the administrator installed, by name.
#[test]
fn through_sudo_codecage_reads_and_chooses_as_the_caller() {
    as_root(|| {
        let dir = TempDir::new("sudo");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let secret = dir.path().join("secret.py");
        std::fs::write(&secret, "print('root only')\n").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let as_nobody = |args: &[&str]| {
            let out = codecage_run()
                .env("SUDO_UID", "65534")
                .env("SUDO_GID", "65534")
                .env("SUDO_USER", "nobody")
                .arg("--json")
                .args(args)
                .launch_output();
            parse(out)
        };
        let run = as_nobody(&[secret.to_str().unwrap()]);
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(
            run.json["message"]
                .as_str()
                .unwrap()
                .contains("Permission denied"),
            "{}",
            run.json
        );
        assert!(!run.json.to_string().contains("root only"));
        let profile = dir.path().join("open.toml");
        std::fs::write(&profile, "[hardening]\nseccomp = \"off\"\n").unwrap();
        let run = as_nobody(&["--profile", profile.to_str().unwrap(), "--", "true"]);
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(
            run.json["message"]
                .as_str()
                .unwrap()
                .contains("installed profile"),
            "{}",
            run.json
        );
        let run = as_nobody(&["--rootfs", "/", "--", "true"]);
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        // Root itself may.
        let run = run_json(&[secret.to_str().unwrap()]);
        assert_eq!(run.stdout(), "root only\n", "{}", run.json);
    });
}

/// The mount table a sandbox reads (mountinfo, mounts, mountstats) names no host uid or
/// gid: its tmpfs file systems are made by the launcher in the host's user namespace, as
/// root, so tmpfs prints no owner (made inside, each printed the sandbox root's host uid,
/// and /work a `uid=` of the sandbox user's host uid). Each root still has its owner.
#[test]
fn the_mount_table_shows_no_host_uid_or_gid() {
    as_root(|| {
        let run = bash(
            &[],
            "cat /proc/self/mountinfo /proc/self/mounts /proc/self/mountstats; \
             stat -c '%U:%G %a %n' /tmp /work /dev /dev/shm /sys",
        );
        let out = run.stdout();
        assert!(out.contains(" /work "), "{}", run.json);
        for line in out.lines().filter(|l| l.contains("tmpfs")) {
            assert!(
                !line.contains("uid=") && !line.contains("gid="),
                "a tmpfs shows an owner: {line}"
            );
        }
        for word in out.split(|c: char| c == ',' || c.is_whitespace()) {
            if let Some(id) = word
                .strip_prefix("uid=")
                .or_else(|| word.strip_prefix("gid="))
            {
                let id: u64 = id.parse().unwrap_or(0);
                assert!(
                    id < 0x10_0000,
                    "a host id in the mount table: {word}\n{out}"
                );
            }
        }
        assert!(
            out.contains("root:root 1777 /tmp")
                && out.contains("sandbox:sandbox 755 /work")
                && out.contains("root:root 755 /dev")
                && out.contains("root:root 1777 /dev/shm"),
            "{out}"
        );
    });
}
