//! What the payload can see and reach: processes, network, host name, ids, fds.

use std::os::fd::AsFd;

use super::common::*;

#[test]
fn ps_sees_only_the_sandbox_and_pid_1_is_codecage_init() {
    as_root(|| {
        let run = bash(&[], "ps -eo pid=,comm=,args=; true");
        let lines: Vec<&str> = run.stdout().lines().collect();
        // pid, name (comm) and command line (/proc/1/cmdline): the same on every kernel.
        // The init's argument carries the build's fingerprint (16 hex digits).
        let init: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(init[..3], ["1", "codecage", "codecage"], "{lines:?}");
        let build = init.get(3).and_then(|a| a.strip_prefix("__sandbox-init:"));
        assert!(
            init.len() == 4
                && build.is_some_and(|b| b.len() == 16 && b.bytes().all(|c| c.is_ascii_hexdigit())),
            "{lines:?}"
        );
        // init, bash, ps: nothing of the host.
        assert_eq!(lines.len(), 3, "{lines:?}");
    });
}

#[test]
fn the_network_namespace_has_only_loopback_and_it_is_up() {
    as_root(|| {
        let run = bash(&[], "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
        assert_eq!(run.stdout(), "lo\n", "{}", run.json);
        // lo is up: a datagram goes round, and a TCP server and client on it talk (the
        // namespace is the boundary: nothing but the sandbox is on this loopback).
        let script = "import socket\n\
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0))\n\
            c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.sendto(b'ping', s.getsockname())\n\
            print(s.recv(4).decode())\n\
            for family, host in [(socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')]:\n\
            \x20   l = socket.socket(family); l.bind((host, 0)); l.listen()\n\
            \x20   c = socket.create_connection(l.getsockname()[:2]); a, _ = l.accept()\n\
            \x20   c.sendall(b'tcp'); print(a.recv(3).decode(), host)";
        let run = run_json(&["--lang", "python", "-c", script]);
        assert_eq!(
            run.stdout(),
            "ping\ntcp 127.0.0.1\ntcp ::1\n",
            "{}",
            run.json
        );
    });
}

/// The raw child makes the network namespace itself (unshare, while the launcher makes the
/// cgroups and file systems): it must be a new one, and belong to the sandbox's own user
/// namespace, as one made by clone3 with both flags does. NS_GET_USERNS answers EPERM for
/// an owner outside the caller's user namespace, so the payload can ask it itself.
#[test]
fn the_network_namespace_is_new_and_owned_by_the_sandboxs_user_namespace() {
    as_root(|| {
        let script = "import fcntl, os\n\
            net = os.open('/proc/self/ns/net', os.O_RDONLY)\n\
            owner = fcntl.ioctl(net, 0xb701)  # NS_GET_USERNS: an fd of the owner\n\
            print(os.fstat(owner).st_ino == os.stat('/proc/self/ns/user').st_ino)\n\
            print(os.readlink('/proc/self/ns/net'))";
        let run = run_json(&["--lang", "python", "-c", script]);
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert_eq!(lines.first(), Some(&"True"), "{}", run.json);
        let host = std::fs::read_link("/proc/self/ns/net").unwrap();
        assert_ne!(lines.get(1).copied(), host.to_str(), "{}", run.json);
        assert!(
            lines.get(1).is_some_and(|l| l.starts_with("net:[")),
            "{}",
            run.json
        );
    });
}

#[test]
fn the_hostname_is_sandbox() {
    as_root(|| {
        let run = bash(&[], "hostname; cat /proc/sys/kernel/hostname");
        assert_eq!(run.stdout(), "sandbox\nsandbox\n");
        assert_ne!(nix::unistd::gethostname().unwrap(), "sandbox");
    });
}

/// From the host, every id of the payload (real, effective, saved, fs) is an unprivileged
/// host id, and so are the init's.
#[test]
fn the_payloads_host_uid_is_not_root() {
    as_root(|| {
        let mark = marker("uid");
        let mut child = spawn_bash(&["--timeout", "20"], &format!("exec -a {mark} sleep 30"));
        wait_for_marks(&mut child, &mark, 1);
        let pid = host_pids_with(&mark)[0];
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let ppid: u32 = field(&status, "PPid:")[0].parse().unwrap();
        let init_status = std::fs::read_to_string(format!("/proc/{ppid}/status")).unwrap();
        for (who, status) in [("payload", &status), ("init", &init_status)] {
            for key in ["Uid:", "Gid:"] {
                for id in field(status, key) {
                    let id: u32 = id.parse().unwrap();
                    assert!(
                        id >= 0x7100_0000,
                        "{who} {key} {id} is not in codecage's unprivileged range"
                    );
                }
            }
        }
        kill_launcher(&mut child, &mark);
    });
}

fn field<'a>(status: &'a str, key: &str) -> Vec<&'a str> {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .collect()
}

#[test]
fn the_payload_can_neither_signal_nor_ptrace_pid_1() {
    as_root(|| {
        let script = "import ctypes, os\n\
            libc = ctypes.CDLL(None, use_errno=True)\n\
            for sig in (0, 9, 15):\n\
            \x20   try:\n\
            \x20       os.kill(1, sig); print('kill', sig, 'ok')\n\
            \x20   except PermissionError: print('kill', sig, 'EPERM')\n\
            r = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH\n\
            print('ptrace', r, os.strerror(ctypes.get_errno()))\n\
            try:\n\
            \x20   open('/proc/1/environ').read(); print('environ readable')\n\
            except PermissionError: print('environ EACCES')\n";
        let run = run_json(&["--lang", "python", "-c", script]);
        assert_eq!(
            run.stdout(),
            "kill 0 EPERM\nkill 9 EPERM\nkill 15 EPERM\nptrace -1 Operation not permitted\nenviron EACCES\n",
            "{}",
            run.json
        );
    });
}

#[test]
fn only_stdio_fds_reach_the_payload() {
    as_root(|| {
        // Leak a file and a socket into codecage the way a careless caller would: no CLOEXEC.
        let file = std::fs::File::open("/etc/hostname").unwrap();
        let (sock, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        for fd in [file.as_fd(), sock.as_fd()] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .unwrap();
        }
        let output = codecage_run()
            .args(["--json", "--", "ls", "/proc/self/fd"])
            .launch_output();
        let run = parse(output);
        // 0, 1, 2, and the directory ls itself opened to list them.
        assert_eq!(run.stdout(), "0\n1\n2\n3\n", "{}", run.json);
        let run = run_json(&[
            "--lang",
            "python",
            "-c",
            "import os, stat\nfds = sorted(os.listdir('/proc/self/fd'))\n\
             print(fds, '4' in fds and stat.S_ISFIFO(os.fstat(4).st_mode))",
        ]);
        // A pre-started interpreter (the pooled path) holds one more, its own: the pipe on
        // which it tells the init its end (not inherited by its children; see
        // drivers/prestart.py).
        let expected = if run.json["warm"] == true {
            "['0', '1', '2', '3', '4'] True\n"
        } else {
            "['0', '1', '2', '3'] False\n"
        };
        assert_eq!(run.stdout(), expected, "{}", run.json);
        let run = bash(
            &[],
            "readlink /proc/self/fd/0; ls -l /proc/1/fd 2>&1 | tail -n 1",
        );
        assert!(run.stdout().starts_with("/dev/null\n"), "{}", run.json);
    });
}

#[test]
fn concurrent_runs_do_not_collide() {
    as_root(|| {
        let children: Vec<_> = (0..8)
            .map(|i| {
                spawn_bash(&[], &format!("echo {i} > /work/f; sleep 0.3; cat /work/f; id -u; cat /proc/self/uid_map | tr -s ' ' | tr '\\n' ' '"))
            })
            .collect();
        let mut host_uids = std::collections::BTreeSet::new();
        for (i, child) in children.into_iter().enumerate() {
            let run = finish(child);
            let lines: Vec<&str> = run.stdout().lines().collect();
            assert_eq!(lines[0], i.to_string(), "{}", run.json);
            assert_eq!(lines[1], "1000");
            host_uids.insert(lines[2].to_string());
        }
        assert_eq!(
            host_uids.len(),
            8,
            "each run has its own host ids: {host_uids:?}"
        );
    });
}
