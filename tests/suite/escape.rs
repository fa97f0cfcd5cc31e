//! The escape suite: each attack of the threat model runs inside codecage for real and must
//! fail with the errno named here; then the host is checked ([`as_root`]).

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use super::common::*;

/// Runs a Python attack script. `sys(nr, *args)` makes a raw syscall and returns the errno
/// name ("OK" on success); `NR` holds this architecture's syscall numbers.
fn attack(code: &str) -> Run {
    let prelude = format!(
        "import ctypes, errno, os, socket\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         NR = {numbers}\n\
         def sys(name, *args):\n\
         \x20   r = libc.syscall(NR[name], *[ctypes.c_long(a) for a in args])\n\
         \x20   return 'OK' if r >= 0 else errno.errorcode[ctypes.get_errno()]\n\
         def err(f):\n\
         \x20   try:\n\
         \x20       f(); return 'OK'\n\
         \x20   except OSError as e: return errno.errorcode[e.errno]\n",
        numbers = syscall_numbers()
    );
    let run = run_json(&["--lang", "python", "-c", &format!("{prelude}{code}")]);
    assert_eq!(run.error(), None, "{}", run.json);
    run
}

fn syscall_numbers() -> String {
    let table = [
        ("mount", libc::SYS_mount),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("ptrace", libc::SYS_ptrace),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("chroot", libc::SYS_chroot),
        ("syslog", libc::SYS_syslog),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("pivot_root", libc::SYS_pivot_root),
        ("fsopen", libc::SYS_fsopen),
        ("kexec_load", libc::SYS_kexec_load),
        ("init_module", libc::SYS_init_module),
        ("reboot", libc::SYS_reboot),
        ("settimeofday", libc::SYS_settimeofday),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("ioctl", libc::SYS_ioctl),
        ("personality", libc::SYS_personality),
    ];
    let entries: Vec<String> = table
        .iter()
        .map(|(name, nr)| format!("'{name}': {nr}"))
        .collect();
    format!("{{{}}}", entries.join(", "))
}

#[test]
fn host_secrets_are_not_readable() {
    as_root(|| {
        let run = attack(
            "for p in ['/etc/shadow', '/etc/gshadow', '/root/.bashrc', '/etc/ssh', '/proc/1/root/etc/shadow']:\n\
             \x20   print(p, err(lambda: open(p).read()))",
        );
        assert_eq!(
            run.stdout(),
            "/etc/shadow ENOENT\n/etc/gshadow ENOENT\n/root/.bashrc ENOENT\n/etc/ssh ENOENT\n/proc/1/root/etc/shadow EACCES\n",
            "{}",
            run.json
        );
    });
}

#[test]
fn the_launchers_environment_is_invisible() {
    as_root(|| {
        let out = codecage_run()
            .env("CODECAGE_TEST_SECRET", "s3cr3t-launcher-value")
            .args(["--json", "--", "bash", "-c"])
            .arg("env; cat /proc/1/environ /proc/self/environ 2>&1; for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done; true")
            .launch_output();
        let run = parse(out);
        assert!(!run.json.to_string().contains("s3cr3t"), "{}", run.json);
        assert!(
            run.stdout().contains("/proc/1/environ: Permission denied"),
            "{}",
            run.json
        );
    });
}

#[test]
fn writes_to_usr_etc_and_root_fail_with_erofs() {
    as_root(|| {
        let run = attack("for p in ['/usr/evil', '/etc/evil', '/evil', '/usr/bin/python3']:\n    print(err(lambda: open(p, 'a')))");
        // python3 itself: EROFS too (the read-only mount answers before the permission check
        // for an existing file? no: root-owned, so EACCES comes first).
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert_eq!(lines[..3], ["EROFS", "EROFS", "EROFS"], "{}", run.json);
        assert!(["EROFS", "EACCES"].contains(&lines[3]), "{}", run.json);
    });
}

#[test]
fn host_processes_are_invisible() {
    as_root(|| {
        let run = attack("print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))");
        assert_eq!(
            run.stdout(),
            "[1, 2]\n",
            "only the init and python itself: {}",
            run.json
        );
    });
}

#[test]
fn kill_minus_one_does_not_reach_the_host() {
    as_root(|| {
        let mut victim = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        // kill(-1) reaches every process the caller may signal but itself: here, the sandbox's
        // own sleep. The host's sleep lives on.
        let run = bash(
            &[],
            "sleep 100 & kill -9 -1; wait $!; echo sandbox sleep ended with $?",
        );
        assert_eq!(
            run.stdout(),
            "sandbox sleep ended with 137\n",
            "{}",
            run.json
        );
        assert!(
            victim.try_wait().unwrap().is_none(),
            "a host process was killed"
        );
        victim.kill().unwrap();
        victim.wait().unwrap();
    });
}

#[test]
fn tcp_to_the_hosts_loopback_is_unreachable() {
    as_root(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let run = attack(&format!(
            "print(err(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2)))"
        ));
        // The sandbox's 127.0.0.1 is its own loopback, where nothing listens on that port.
        assert_eq!(run.stdout(), "ECONNREFUSED\n", "{}", run.json);
        assert!(
            listener.accept().is_err(),
            "the host's listener got a connection"
        );
    });
}

#[test]
fn raw_packet_and_netlink_sockets_are_refused() {
    as_root(|| {
        let run = attack(
            "for fam, typ, proto in [(socket.AF_INET, socket.SOCK_RAW, 1), (socket.AF_PACKET, socket.SOCK_RAW, 0),\n\
             \x20                    (40, socket.SOCK_STREAM, 0), (38, socket.SOCK_SEQPACKET, 0),\n\
             \x20                    (socket.AF_INET, socket.SOCK_STREAM, 132)]:\n\
             \x20   print(err(lambda: socket.socket(fam, typ, proto)))\n\
             # Netlink: every protocol but NETLINK_ROUTE (0), raw or datagram.\n\
             for proto in [1, 2, 4, 6, 9, 10, 12, 15, 16, 17, 18, 21]:\n\
             \x20   for typ in [socket.SOCK_RAW, socket.SOCK_DGRAM]:\n\
             \x20       print(proto, err(lambda: socket.socket(socket.AF_NETLINK, typ, proto)))",
        );
        // AF_INET raw, AF_PACKET, AF_VSOCK (40), AF_ALG (38), and SCTP (protocol 132: its
        // module would load on demand).
        let mut expected = "EPERM\n".repeat(5);
        for proto in [1, 2, 4, 6, 9, 10, 12, 15, 16, 17, 18, 21] {
            expected.push_str(&format!("{proto} EPERM\n{proto} EPERM\n"));
        }
        assert_eq!(run.stdout(), expected, "{}", run.json);
    });
}

/// NETLINK_ROUTE reads the sandbox's own interfaces (only `lo`); changing them (here:
/// setting lo down, adding an address) needs CAP_NET_ADMIN, which the payload lacks.
#[test]
fn netlink_route_reads_the_sandbox_interfaces_and_changes_nothing() {
    as_root(|| {
        let run = attack(
            "import struct\n\
             print(socket.if_nameindex())\n\
             def ask(kind, flags, body):\n\
             \x20   s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n\
             \x20   s.send(struct.pack('=LHHLL', 16 + len(body), kind, 1 | 4 | flags, 1, 0) + body)\n\
             \x20   reply = s.recv(4096)\n\
             \x20   code = struct.unpack('=i', reply[16:20])[0]\n\
             \x20   return errno.errorcode.get(-code, code)\n\
             # RTM_SETLINK (19): lo (index 1) down.\n\
             print(ask(19, 0, struct.pack('=BxHiII', 0, 0, 1, 0, 1)))\n\
             # RTM_NEWADDR (20), NLM_F_CREATE|NLM_F_EXCL: 10.9.9.9/8 on lo.\n\
             addr = struct.pack('=BBBBi', socket.AF_INET, 8, 0, 0, 1) + struct.pack('=HH4s', 8, 2, socket.inet_aton('10.9.9.9'))\n\
             print(ask(20, 0x400 | 0x200, addr))\n\
             import fcntl\n\
             flags = struct.unpack('=16sH', fcntl.ioctl(socket.socket(), 0x8913, struct.pack('=16sH', b'lo', 0)))[1]\n\
             print('up' if flags & 1 else 'down')",
        );
        assert_eq!(
            run.stdout(),
            "[(1, 'lo')]\nEPERM\nEPERM\nup\n",
            "{}",
            run.json
        );
    });
}

#[test]
fn ptrace_of_another_sandbox_process_is_refused() {
    as_root(|| {
        let run = attack(
            "import subprocess\n\
             child = subprocess.Popen(['sleep', '10'])\n\
             print(sys('ptrace', 16, child.pid, 0, 0))  # PTRACE_ATTACH\n\
             print(sys('process_vm_readv', child.pid, 0, 0, 0, 0, 0))\n\
             child.kill()",
        );
        assert_eq!(run.stdout(), "EPERM\nEPERM\n", "{}", run.json);
    });
}

#[test]
fn mounting_anything_is_refused() {
    as_root(|| {
        let run = attack(
            "print(sys('mount', 0, 0, 0, 0, 0))\n\
             print(sys('fsopen', 0, 0))\n\
             print(sys('pivot_root', 0, 0))\n\
             import subprocess\n\
             r = subprocess.run(['mount', '-t', 'tmpfs', 'x', '/tmp'], capture_output=True, text=True)\n\
             print(r.returncode != 0)",
        );
        assert_eq!(run.stdout(), "EPERM\nEPERM\nEPERM\nTrue\n", "{}", run.json);
    });
}

#[test]
fn nested_user_namespaces_are_refused() {
    as_root(|| {
        let run = attack(
            "print(sys('unshare', 0x10000000))  # CLONE_NEWUSER\n\
             print(sys('unshare', 0x20000))  # CLONE_NEWNS\n\
             print(sys('setns', 0, 0))\n\
             print(sys('clone', 0x10000000 | 17, 0, 0, 0, 0))  # CLONE_NEWUSER|SIGCHLD\n\
             print(sys('clone3', 0, 0))\n\
             import subprocess\n\
             r = subprocess.run(['unshare', '-U', 'true'], capture_output=True, text=True)\n\
             print(r.returncode, 'Operation not permitted' in r.stderr)",
        );
        assert_eq!(
            run.stdout(),
            "EPERM\nEPERM\nEPERM\nEPERM\nENOSYS\n1 True\n",
            "{}",
            run.json
        );
    });
}

#[test]
fn kernel_attack_surface_syscalls_are_refused() {
    as_root(|| {
        let run = attack(
            "for name, args in [('keyctl', (0, 0)), ('add_key', (0, 0, 0, 0, 0)), ('bpf', (0, 0, 0)),\n\
             \x20                  ('perf_event_open', (0, 0, -1, -1, 0)), ('io_uring_setup', (1, 0)), ('userfaultfd', (0,)),\n\
             \x20                  ('kexec_load', (0, 0, 0, 0)), ('init_module', (0, 0, 0)), ('reboot', (0, 0, 0, 0)),\n\
             \x20                  ('settimeofday', (0, 0)), ('personality', (0x0400000,))]:\n\
             \x20   print(name, sys(name, *args))",
        );
        for line in run.stdout().lines() {
            assert!(line.ends_with(" EPERM"), "{line}: {}", run.json);
        }
        assert_eq!(run.stdout().lines().count(), 11, "{}", run.json);
    });
}

#[test]
fn setuid_binaries_give_no_privilege() {
    as_root(|| {
        // su, mount and friends are setuid root on the host; here they run as uid 1000.
        let run = bash(&[], "stat -c %A /usr/bin/su; su -c id root </dev/null 2>&1 | head -1; umount /proc 2>&1; echo $?");
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert!(
            lines[0].starts_with("-rws"),
            "the test needs a setuid su: {}",
            run.json
        );
        assert!(!run.stdout().contains("uid=0"), "{}", run.json);
        assert_ne!(lines.last(), Some(&"0"), "{}", run.json);
    });
}

#[test]
fn proc_sys_and_sysrq_are_not_writable() {
    as_root(|| {
        let run = attack(
            "for p in ['/proc/sys/kernel/hostname', '/proc/sys/vm/drop_caches', '/proc/sysrq-trigger']:\n\
             \x20   print(p, err(lambda: open(p, 'w').write('1')))",
        );
        for line in run.stdout().lines() {
            // (ENOENT: this kernel has no magic SysRq.)
            let ok = line.ends_with(" EROFS")
                || line.ends_with(" EACCES")
                || line == "/proc/sysrq-trigger ENOENT";
            assert!(ok, "{line}: {}", run.json);
        }
        assert_eq!(run.stdout().lines().count(), 3);
    });
}

#[test]
fn the_kernel_log_and_raw_devices_are_out_of_reach() {
    as_root(|| {
        let run = attack(
            "print('syslog', sys('syslog', 3, 0, 0))  # SYSLOG_ACTION_READ_ALL\n\
             for p in ['/dev/mem', '/dev/kmsg', '/dev/vda', '/dev/sda', '/dev/port']:\n\
             \x20   print(p, err(lambda: open(p, 'rb')))\n\
             print('mknod', err(lambda: os.mknod('/tmp/mem', 0o600 | 0o020000, os.makedev(1, 1))))",
        );
        assert_eq!(
            run.stdout(),
            "syslog EPERM\n/dev/mem ENOENT\n/dev/kmsg ENOENT\n/dev/vda ENOENT\n/dev/sda ENOENT\n/dev/port ENOENT\nmknod EPERM\n",
            "{}",
            run.json
        );
        let run = bash(&[], "dmesg >/dev/null 2>&1; echo $?");
        assert_ne!(run.stdout(), "0\n");
    });
}

#[test]
fn file_handles_and_chroot_are_refused() {
    as_root(|| {
        let run = attack(
            "print(sys('open_by_handle_at', 0, 0, 0))\n\
             print(sys('name_to_handle_at', 0, 0, 0, 0, 0))\n\
             print(sys('chroot', 0))\n\
             print(err(lambda: os.chroot('/tmp')))",
        );
        assert_eq!(run.stdout(), "EPERM\nEPERM\nEPERM\nEPERM\n", "{}", run.json);
    });
}

#[test]
fn the_launcher_binary_cannot_be_opened_for_writing() {
    as_root(|| {
        let run = attack(
            "print('/proc/1/exe', err(lambda: open('/proc/1/exe', 'r+b')))\n\
             print('/proc/1/exe read', err(lambda: open('/proc/1/exe', 'rb')))\n\
             print('/proc/self/exe', err(lambda: open('/proc/self/exe', 'r+b')))",
        );
        let lines: Vec<&str> = run.stdout().lines().collect();
        // pid 1 is codecage, not dumpable and of another uid: not even readable.
        assert_eq!(lines[0], "/proc/1/exe EACCES", "{}", run.json);
        assert_eq!(lines[1], "/proc/1/exe read EACCES", "{}", run.json);
        // python's own binary: root-owned on a read-only mount, and busy.
        assert!(
            [
                "/proc/self/exe EACCES",
                "/proc/self/exe EROFS",
                "/proc/self/exe ETXTBSY"
            ]
            .contains(&lines[2]),
            "{}",
            run.json
        );
        // And the host's binary is untouched.
        let mut bytes = Vec::new();
        std::fs::File::open(env!("CARGO_BIN_EXE_codecage"))
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        assert!(bytes.starts_with(b"\x7fELF"));
    });
}

#[test]
fn terminal_injection_is_refused() {
    as_root(|| {
        // TIOCSTI on any fd is refused by seccomp before the kernel looks at the terminal.
        let run = attack("print(sys('ioctl', 0, 0x5412, 0))\nprint(os.getsid(0) == os.getpid())");
        assert_eq!(run.stdout(), "EPERM\nTrue\n", "{}", run.json);
    });
}

#[test]
fn proc_self_status_shows_every_layer() {
    as_root(|| {
        let run = bash(
            &[],
            "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb|CapInh):' /proc/self/status",
        );
        assert_eq!(
            run.stdout(),
            "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
             CapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n",
            "{}",
            run.json
        );
        // Landlock at the kernel's ABI, and each feature of a newer ABI listed with the layer
        // that covers it (none from ABI 6); without landlock (a profile that opts in, as in
        // the no-landlock lane), the whole layer listed, covered by nothing.
        let skipped = run.json["skipped_layers"].as_array().unwrap();
        for entry in skipped {
            assert_eq!(entry["layer"], "landlock", "{}", run.json);
        }
        match kernel_landlock_abi() {
            Some(abi) => {
                assert_eq!(
                    run.json["landlock_abi"].as_u64(),
                    Some(u64::from(abi)),
                    "{}",
                    run.json
                );
                let lacking: Vec<String> = skipped
                    .iter()
                    .map(|e| {
                        assert!(
                            e["covered_by"].as_str().is_some_and(|c| !c.is_empty()),
                            "{e}"
                        );
                        e["feature"].as_str().unwrap().to_string()
                    })
                    .collect();
                // ABI 4's TCP rules are not asked for in network mode none (the namespace
                // is the boundary), so they are never listed here.
                let newer: Vec<u32> = (abi + 1..=6).filter(|&a| a != 4).collect();
                assert_eq!(lacking.len(), newer.len(), "{}", run.json);
                for (feature, newer) in lacking.iter().zip(newer) {
                    assert!(
                        feature.contains(&format!("landlock ABI {newer},")),
                        "{feature}"
                    );
                }
            }
            None => {
                assert_eq!(run.json["landlock_abi"], serde_json::Value::Null);
                assert_eq!(skipped.len(), 1, "{}", run.json);
                assert_eq!(skipped[0]["feature"], "the whole layer", "{}", run.json);
                assert_eq!(
                    skipped[0]["covered_by"],
                    serde_json::Value::Null,
                    "{}",
                    run.json
                );
            }
        }
    });
}

#[test]
fn the_sandbox_cannot_signal_its_init_even_as_a_group() {
    as_root(|| {
        let run = attack("import signal\nprint(err(lambda: os.kill(1, signal.SIGKILL)))\nprint(err(lambda: os.killpg(1, signal.SIGKILL)))");
        assert_eq!(run.stdout(), "EPERM\nESRCH\n", "{}", run.json);
        std::thread::sleep(Duration::from_millis(10));
    });
}

/// The seccomp allow-list and landlock leave ordinary programs alone: Node with worker
/// threads and child processes, a bash pipeline, Python threads and subprocesses.
#[test]
fn the_filters_leave_ordinary_programs_alone() {
    as_root(|| {
        let node = "const { Worker } = require('worker_threads');\n\
            const { execSync } = require('child_process');\n\
            const w = new Worker('require(\"worker_threads\").parentPort.postMessage(6 * 7)', { eval: true });\n\
            w.on('message', m => { console.log('worker', m, execSync('echo hi | tr a-z A-Z').toString().trim()); });";
        // The profile's 30 s at half a CPU is the test's luck under TCG and a loaded host
        // (15 s of CPU there): the timeout scales with the lane's slowdown instead.
        let run = run_json(&["--lang", "node", "--timeout", &secs(30), "-c", node]);
        assert_eq!(run.stdout(), "worker 42 HI\n", "{}", run.json);
        let run = bash(&[], "seq 1 100 | awk '{s += $1} END {print s}' | sed 's/^/sum /' | grep sum | tee /tmp/x | wc -l; cat /tmp/x");
        assert_eq!(run.stdout(), "1\nsum 5050\n", "{}", run.json);
        let py = "import subprocess, threading, concurrent.futures as cf\n\
            with cf.ThreadPoolExecutor(4) as ex: print(sum(ex.map(lambda x: x * x, range(10))))\n\
            print(subprocess.run(['uname', '-s'], capture_output=True, text=True).stdout.strip())";
        let run = run_json(&["--lang", "python", "-c", py]);
        assert_eq!(run.stdout(), "285\nLinux\n", "{}", run.json);
    });
}

#[test]
fn rlimits_are_lowered() {
    as_root(|| {
        let run = bash(
            &["--tmp-size", "16M"],
            "ulimit -c; ulimit -n; ulimit -s; ulimit -f",
        );
        // core 0, 1024 files, 8 MiB stacks; file sizes unlimited (the tmpfs sizes bound
        // them), or the launcher's own limit.
        let fsize = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE)
            .unwrap()
            .0
        {
            libc::RLIM_INFINITY => "unlimited".to_string(),
            bytes => (bytes / 1024).to_string(),
        };
        assert_eq!(
            run.stdout(),
            format!("0\n1024\n8192\n{fsize}\n"),
            "{}",
            run.json
        );
    });
}

/// The sandbox's user namespace belongs to its own unprivileged uid, so the kernel charges
/// its inotify instances there: a sandbox that takes all it may leaves host root's intact.
#[test]
fn inotify_exhaustion_does_not_reach_host_root() {
    as_root(|| {
        let code = "import ctypes, time\n\
            libc = ctypes.CDLL(None, use_errno=True)\n\
            n = 0\n\
            while n < 100000 and libc.inotify_init() >= 0: n += 1\n\
            print('held', n, flush=True)\n\
            time.sleep(30)";
        let mark = marker("inotify");
        let mut child = codecage_run()
            .args(["--timeout", &secs(40)])
            .args(marked(&mark, &["python3", "-c", code]))
            .stdout(std::process::Stdio::piped())
            .launch();
        // Until the sandbox holds every inotify instance it may have.
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        std::thread::sleep(Duration::from_millis(300 * slowdown()));
        let probe = "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.inotify_init() >= 0, ctypes.get_errno())";
        let host = std::process::Command::new("/usr/bin/python3")
            .args(["-c", probe])
            .output()
            .unwrap();
        kill_launcher(&mut child, &mark);
        let host = String::from_utf8_lossy(&host.stdout).to_string();
        assert!(
            line.starts_with("held "),
            "the sandbox did not hold its instances: {line}"
        );
        assert!(
            host.starts_with("True"),
            "host root could not create an inotify instance: {host}"
        );
    });
}

/// A calling program that ignores SIGCHLD (as many daemons do) or runs with umask 077
/// (systemd's UMask=0077) gets normal runs: the init resets both, and what the launcher
/// writes on the sandbox's file systems (its /etc, mount points, /dev, /proc and /sys
/// files) has its modes and the sandbox root as owner whatever the caller's umask.
#[test]
fn an_ignored_sigchld_or_a_strict_umask_in_the_caller_changes_nothing() {
    as_root(|| {
        let exe = env!("CARGO_BIN_EXE_codecage");
        let wrapper = format!(
            "import os, signal\n\
             signal.signal(signal.SIGCHLD, signal.SIG_IGN); os.umask(0o077)\n\
             os.execv('{exe}', ['codecage', 'run', '--json', '--rootfs', 'host', '--timeout', '{t}', '--',\n\
                      'bash', '-c', 'echo hi; cut -d: -f1 /etc/passwd | head -1; stat -c %a /etc; \\
                      stat -c \"%U:%G %a %n\" /etc/passwd /tmp /dev/shm /dev/pts /dev/null /dev/ptmx /proc/meminfo /sys/devices/system/cpu/online'])",
            t = secs(10)
        );
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &wrapper])
            .launch_output();
        let run = parse(out);
        assert_eq!(run.error(), None, "{}", run.json);
        assert_eq!(
            run.stdout(),
            "hi\nroot\n755\n\
             root:root 644 /etc/passwd\n\
             root:root 1777 /tmp\n\
             root:root 1777 /dev/shm\n\
             root:root 755 /dev/pts\n\
             nobody:nogroup 666 /dev/null\n\
             root:root 777 /dev/ptmx\n\
             root:root 644 /proc/meminfo\n\
             root:root 644 /sys/devices/system/cpu/online\n",
            "{}",
            run.json
        );
    });
}
