//! Compatibility: what real programs and test suites need works in the sandbox as it does
//! bare: ptys, TCP on the sandbox's own loopback, interface enumeration, a project's own
//! tests run from a volume, the ci profile's limits, ids a test suite switches to.

use std::path::Path;

use super::common::*;

fn python(flags: &[&str], code: &str) -> Run {
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "python3", "-u", "-c", code]);
    run_json(&args)
}

#[test]
fn a_payload_opens_ptys_of_its_own_and_sees_no_host_pty() {
    as_root(|| {
        let run = python(
            &[],
            "import os, pty, errno\n\
             print(sorted(os.listdir('/dev/pts')))\n\
             m, s = os.openpty()\n\
             print(os.ttyname(s), os.isatty(s))\n\
             os.write(m, b'ping\\n'); print(os.read(s, 5))\n\
             pid, fd = pty.fork()\n\
             if pid == 0:\n\
             \x20   os.write(1, f'child on {os.ttyname(0)}'.encode()); os._exit(3)\n\
             out = b''\n\
             while True:\n\
             \x20   try: chunk = os.read(fd, 64)\n\
             \x20   except OSError: break\n\
             \x20   if not chunk: break\n\
             \x20   out += chunk\n\
             print(out.decode(), os.waitpid(pid, 0)[1] >> 8)\n\
             held = []\n\
             try:\n\
             \x20   while True: held.append(os.openpty())\n\
             except OSError as e: print(len(held) + 2, errno.errorcode[e.errno])",
        );
        assert_eq!(run.error(), None, "{}", run.json);
        let lines: Vec<&str> = run.stdout().lines().collect();
        // Before any pty is opened the sandbox's devpts holds only its ptmx: no host pty.
        assert_eq!(lines[0], "['ptmx']", "{}", run.json);
        assert_eq!(lines[1], "/dev/pts/0 True", "{}", run.json);
        assert_eq!(lines[2], "b'ping\\n'", "{}", run.json);
        assert_eq!(lines[3], "child on /dev/pts/1 3", "{}", run.json);
        // The devpts instance's max: 32 ptys at once (2 still held above).
        assert_eq!(lines[4], "32 ENOSPC", "{}", run.json);
    });
}

#[test]
fn an_http_server_and_client_talk_on_the_sandbox_loopback() {
    as_root(|| {
        let run = python(
            &["--timeout", &secs(30)],
            "import http.server, threading, urllib.request, socket\n\
             class V6(http.server.ThreadingHTTPServer): address_family = socket.AF_INET6\n\
             for cls, host in [(http.server.ThreadingHTTPServer, '127.0.0.1'), (V6, '::1')]:\n\
             \x20   srv = cls((host, 0), http.server.SimpleHTTPRequestHandler)\n\
             \x20   threading.Thread(target=srv.serve_forever, daemon=True).start()\n\
             \x20   url = f'http://[{host}]:{srv.server_port}/' if ':' in host else f'http://{host}:{srv.server_port}/'\n\
             \x20   print(urllib.request.urlopen(url, timeout=5).status, host)\n\
             \x20   srv.shutdown()",
        );
        assert_eq!(run.stdout(), "200 127.0.0.1\n200 ::1\n", "{}", run.json);
    });
}

#[test]
fn interfaces_are_listed_from_python_glibc_and_node() {
    as_root(|| {
        let run = python(
            &[],
            "import socket, ctypes\n\
             print(socket.if_nameindex())\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             p = ctypes.c_void_p()\n\
             print('getifaddrs', libc.getifaddrs(ctypes.byref(p))); libc.freeifaddrs(p)",
        );
        assert_eq!(run.stdout(), "[(1, 'lo')]\ngetifaddrs 0\n", "{}", run.json);
        let run = run_json(&[
            "--timeout",
            &secs(30),
            "--lang",
            "node",
            "-c",
            "const i = require('os').networkInterfaces();\n\
             console.log(Object.keys(i).join(), i.lo.map(a => a.address).join())",
        ]);
        assert_eq!(run.stdout(), "lo 127.0.0.1,::1\n", "{}", run.json);
    });
}

/// A small Python project with a unittest suite.
fn python_project(dir: &Path) {
    std::fs::create_dir_all(dir.join("calc")).unwrap();
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::write(
        dir.join("calc/__init__.py"),
        "def add(a, b):\n    return a + b\n",
    )
    .unwrap();
    std::fs::write(dir.join("tests/__init__.py"), "").unwrap();
    std::fs::write(
        dir.join("tests/test_calc.py"),
        "import os, tempfile, unittest\n\
         from calc import add\n\
         class TestCalc(unittest.TestCase):\n\
         \x20   def test_add(self):\n\
         \x20       self.assertEqual(add(2, 3), 5)\n\
         \x20   def test_tempfile(self):\n\
         \x20       with tempfile.NamedTemporaryFile() as f: f.write(b'x')\n\
         \x20   def test_data_file(self):\n\
         \x20       here = os.path.dirname(__file__)\n\
         \x20       self.assertTrue(os.path.exists(os.path.join(here, 'test_calc.py')))\n",
    )
    .unwrap();
}

/// The names of everything under `dir`, to compare before and after a run.
fn listing(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            names.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    names.sort();
    names
}

#[test]
fn a_python_project_runs_its_unittest_suite_from_a_read_only_volume() {
    as_root(|| {
        let project = TempDir::new("pyproject");
        python_project(project.path());
        let before = listing(project.path());
        let volume = format!("{}:/work/src", project.path().display());
        let run = bash(
            &["--timeout", &secs(30), "-v", &volume],
            "cd /work/src && python3 -m unittest discover -v 2>&1 | tail -3; echo rc=${PIPESTATUS[0]}",
        );
        assert_eq!(run.error(), None, "{}", run.json);
        assert!(
            run.stdout().contains("Ran 3 tests") && run.stdout().ends_with("OK\nrc=0\n"),
            "{}",
            run.json
        );
        // Python could not write its bytecode cache there: the host's tree is unchanged.
        assert_eq!(listing(project.path()), before);
    });
}

#[test]
fn a_node_project_runs_npm_test_from_a_copied_volume() {
    as_root(|| {
        let project = TempDir::new("nodeproject");
        let dir = project.path();
        std::fs::create_dir_all(dir.join("test")).unwrap();
        std::fs::write(
            dir.join("package.json"),
            r#"{"name": "calc", "version": "1.0.0", "scripts": {"test": "node --test"}}"#,
        )
        .unwrap();
        std::fs::write(dir.join("index.js"), "exports.add = (a, b) => a + b;\n").unwrap();
        std::fs::write(
            dir.join("test/calc.test.js"),
            "const test = require('node:test');\n\
             const assert = require('node:assert');\n\
             const fs = require('node:fs');\n\
             const { add } = require('..');\n\
             test('adds', () => assert.strictEqual(add(2, 3), 5));\n\
             test('writes its output beside the code', () => {\n\
             \x20 fs.writeFileSync(__dirname + '/out.txt', 'x');\n\
             \x20 assert.ok(fs.existsSync(__dirname + '/out.txt'));\n\
             });\n",
        )
        .unwrap();
        let before = listing(dir);
        let volume = format!("{}:/work/src:copy", dir.display());
        // npm is not in every lane's image (Debian's nodejs comes without it); there the
        // script it would run runs alone.
        let run = bash(
            &["--timeout", &secs(60), "-v", &volume],
            "cd /work/src && if command -v npm >/dev/null; then npm test 2>&1; else node --test 2>&1; fi; \
             echo rc=$?; ls test",
        );
        assert_eq!(run.error(), None, "{}", run.json);
        assert!(
            run.stdout().contains("# pass 2") && run.stdout().contains("# fail 0"),
            "{}",
            run.json
        );
        assert!(
            run.stdout().ends_with("rc=0\ncalc.test.js\nout.txt\n"),
            "{}",
            run.json
        );
        // The copy took the write; the host's directory did not.
        assert_eq!(listing(dir), before);
    });
}

#[test]
fn writes_to_a_read_only_volume_fail_with_erofs() {
    as_root(|| {
        let project = TempDir::new("rovolume");
        use std::os::unix::fs::PermissionsExt;
        // Open to every user on the host: only the volume's read-only mount stops writes.
        let kept = project.path().join("kept.txt");
        std::fs::write(&kept, "kept").unwrap();
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::create_dir(project.path().join("dir")).unwrap();
        for dir in [project.path().to_path_buf(), project.path().join("dir")] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let volume = format!("{}:/work/src:ro", project.path().display());
        let run = python(
            &["-v", &volume],
            "import os, errno\n\
             def err(f):\n\
             \x20   try: f(); return 'OK'\n\
             \x20   except OSError as e: return errno.errorcode[e.errno]\n\
             print(err(lambda: open('/work/src/new.txt', 'w')))\n\
             print(err(lambda: open('/work/src/kept.txt', 'a')))\n\
             print(err(lambda: os.unlink('/work/src/kept.txt')))\n\
             print(err(lambda: os.mkdir('/work/src/dir/sub')))\n\
             print(err(lambda: os.chmod('/work/src/kept.txt', 0o777)))\n\
             print(err(lambda: os.rename('/work/src/kept.txt', '/work/moved.txt')))\n\
             print(open('/work/src/kept.txt').read())\n\
             open('/work/beside.txt', 'w').write('the rest of /work stays writable')",
        );
        assert_eq!(
            run.stdout(),
            "EROFS\nEROFS\nEROFS\nEROFS\nEROFS\nEXDEV\nkept\n",
            "{}",
            run.json
        );
        assert_eq!(run.exit_code(), Some(0), "{}", run.json);
        assert_eq!(
            std::fs::read_to_string(project.path().join("kept.txt")).unwrap(),
            "kept"
        );
    });
}

#[test]
fn a_symlink_out_of_a_volume_does_not_expose_the_host_file() {
    as_root(|| {
        let outside = TempDir::new("outside");
        let secret = outside.path().join("secret.txt");
        let word = marker("volume-secret");
        std::fs::write(&secret, &word).unwrap();
        let project = TempDir::new("linkproject");
        std::os::unix::fs::symlink(&secret, project.path().join("absolute")).unwrap();
        let relative = Path::new("..")
            .join(outside.path().file_name().unwrap())
            .join("secret.txt");
        std::os::unix::fs::symlink(&relative, project.path().join("relative")).unwrap();
        std::os::unix::fs::symlink(outside.path(), project.path().join("dir")).unwrap();
        for mode in ["ro", "copy"] {
            let volume = format!("{}:/work/src:{mode}", project.path().display());
            let run = bash(
                &["-v", &volume],
                "cd /work/src; for f in absolute relative dir/secret.txt; do cat $f 2>/dev/null || echo \"$f: none\"; done; \
                 readlink absolute",
            );
            assert_eq!(run.error(), None, "{mode}: {}", run.json);
            assert!(
                !run.json.to_string().contains(&word),
                "{mode}: {}",
                run.json
            );
            // The links are there, as links, and resolve inside the sandbox, where the
            // host's file does not exist.
            assert_eq!(
                run.stdout(),
                format!(
                    "absolute: none\nrelative: none\ndir/secret.txt: none\n{}\n",
                    secret.display()
                ),
                "{mode}: {}",
                run.json
            );
        }
    });
}

/// The launcher opens the volume, so the directories above it need not be open to others;
/// inside, what the host lets any user read, and no more, is readable.
#[test]
fn a_volume_shows_what_any_host_user_may_read_and_no_more() {
    as_root(|| {
        use std::os::unix::fs::PermissionsExt;
        let private = TempDir::new("private");
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let project = private.path().join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(project.join("open.txt"), "open").unwrap();
        let closed = project.join("closed.txt");
        std::fs::write(&closed, "closed").unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o600)).unwrap();
        let volume = format!("{}:/work/src", project.display());
        let run = bash(
            &["-v", &volume],
            "cat /work/src/open.txt; echo; cat /work/src/closed.txt 2>&1 | sed 's/.*: //'",
        );
        assert_eq!(run.stdout(), "open\nPermission denied\n", "{}", run.json);
        let volume = format!("{}:/work/src:copy", project.display());
        let run = bash(&["-v", &volume], "true");
        assert_eq!(run.error(), Some("setup"), "{}", run.json);
        let message = run.json["message"].as_str().unwrap();
        assert!(
            message.contains("closed.txt") && message.contains("readable by any user"),
            "{message}"
        );
    });
}

#[test]
fn a_copy_larger_than_work_is_refused_with_a_message_naming_work_size() {
    as_root(|| {
        let project = TempDir::new("bigproject");
        std::fs::write(project.path().join("big.bin"), vec![7u8; 3 << 20]).unwrap();
        let volume = format!("{}:/work/src:copy", project.path().display());
        let run = bash(&["--work-size", "1M", "-v", &volume], "true");
        assert_eq!(run.error(), Some("setup"), "{}", run.json);
        let message = run.json["message"].as_str().unwrap();
        assert!(
            message.contains("does not fit in /work (1M")
                && message.contains("work_size")
                && message.contains("the code did not run"),
            "{message}"
        );
        // Within the size, the copy is whole and the code sees it.
        let run = bash(
            &["-v", &volume],
            "cmp -s /work/src/big.bin <(head -c 3145728 /dev/zero | tr '\\0' '\\7') && echo same",
        );
        assert_eq!(run.stdout(), "same\n", "{}", run.json);
    });
}

#[test]
fn volumes_that_would_write_to_the_host_or_leave_work_are_refused() {
    let dir = TempDir::new("badvolume");
    let path = dir.path().display().to_string();
    for (volume, says) in [
        (format!("{path}:/work/src:rw"), "never writable"),
        (format!("{path}:/etc"), "under it"),
        (format!("{path}:/work/../etc"), "without . or .."),
        (format!("{path}:/work"), "cannot be /work itself"),
        (format!("{path}/nonexistent:/work/src"), "No such file"),
        (format!("{path}:/work/a -v {path}:/work/a/b"), "overlap"),
    ] {
        let mut args = vec!["--json".to_string(), "--rootfs".into(), "host".into()];
        for v in volume.split(" -v ") {
            args.extend(["-v".to_string(), v.to_string()]);
        }
        args.extend(["--".into(), "true".into()]);
        let run = parse(codecage().arg("run").args(&args).launch_output());
        assert_eq!(
            run.error(),
            Some("invalid_request"),
            "{volume}: {}",
            run.json
        );
        let message = run.json["message"].as_str().unwrap();
        assert!(message.contains(says), "{volume}: {message}");
    }
}

#[test]
fn the_ci_profile_allows_long_wide_test_runs() {
    as_root(|| {
        let run = run_json(&[
            "--profile",
            "ci",
            "--timeout",
            "1h",
            "--",
            "bash",
            "-c",
            "ulimit -n; ulimit -u; df -k --output=size /work | tail -1 | tr -d ' '",
        ]);
        assert_eq!(run.error(), None, "{}", run.json);
        // 8192 files (rlimits are only ever lowered: under a launcher whose hard limit is
        // lower, as in the VM lanes' 4096, that one); 512 processes (+1: the cgroup, not
        // the rlimit, refuses first); a 2G /work.
        let (_, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let nofile = hard.min(8192);
        assert_eq!(
            run.stdout(),
            format!("{nofile}\n513\n2097152\n"),
            "{}",
            run.json
        );
        let run = run_json(&["--profile", "ci", "--timeout", "61m", "--", "true"]);
        assert_eq!(run.error(), Some("policy"), "{}", run.json);
        let message = run.json["message"].as_str().unwrap();
        assert!(message.contains("at most 3600s"), "{message}");
    });
}

/// Test suites switch to nobody to see the switch refused: the id is mapped, so an
/// unprivileged process gets EPERM, as bare, rather than EINVAL for an id that does not
/// exist.
#[test]
fn switching_to_nobody_is_refused_with_eperm() {
    as_root(|| {
        let run = python(
            &[],
            "import os, errno, subprocess, sys\n\
             for f in (lambda: os.setuid(65534), lambda: os.setgid(65534), lambda: os.setgroups([65534])):\n\
             \x20   try: f()\n\
             \x20   except OSError as e: print(errno.errorcode[e.errno])\n\
             try: subprocess.run([sys.executable, '-c', '1'], user='nobody')\n\
             except PermissionError as e: print('subprocess', errno.errorcode[e.errno])",
        );
        assert_eq!(
            run.stdout(),
            "EPERM\nEPERM\nEPERM\nsubprocess EPERM\n",
            "{}",
            run.json
        );
    });
}

/// No file size limit: a sparse file larger than its tmpfs takes only the blocks written
/// (LMDB's map files, large-file tests); the tmpfs size still bounds what is written.
#[test]
fn a_sparse_file_may_be_larger_than_its_tmpfs() {
    as_root(|| {
        let run = python(
            &["--tmp-size", "16M"],
            "import os, resource\n\
             print(resource.getrlimit(resource.RLIMIT_FSIZE)[1] == resource.RLIM_INFINITY or 'limited')\n\
             with open('/tmp/sparse', 'wb') as f:\n\
             \x20   f.seek(5 << 30); f.write(b'end')\n\
             st = os.stat('/tmp/sparse'); print(st.st_size, st.st_blocks * 512 <= 1 << 20)\n\
             try:\n\
             \x20   open('/tmp/full', 'wb').write(b'x' * (32 << 20))\n\
             except OSError as e: print(e.strerror)",
        );
        let expected_first =
            match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE)
                .unwrap()
                .1
            {
                libc::RLIM_INFINITY => "True",
                _ => "limited",
            };
        assert_eq!(
            run.stdout(),
            format!("{expected_first}\n5368709123 True\nNo space left on device\n"),
            "{}",
            run.json
        );
    });
}

/// A mount inside a read-only volume is read-only too (the launcher's recursive
/// mount_setattr, and the init's remount of every mount of the tree on kernels without it).
#[test]
fn mounts_inside_a_read_only_volume_are_read_only_too() {
    as_root(|| {
        let project = TempDir::new("nested");
        let inner = project.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        // The tmpfs and the launcher live in a mount namespace of the test's own: the
        // other tests' host checks must not see the mount (see host.rs).
        let ns = MountNamespace::with_tmpfs(&inner, "size=1m,mode=0777");
        let volume = format!("{}:/work/src", project.path().display());
        let run = parse(
            ns.codecage()
                .args(["run", "--json", "--rootfs", "host", "-v", &volume, "--", "bash", "-c"])
                .arg("touch /work/src/inner/x 2>&1 | sed 's/.*: //'; grep -c ' /work/src/inner ro,' /proc/self/mountinfo")
                .launch_output(),
        );
        assert_eq!(run.stdout(), "Read-only file system\n1\n", "{}", run.json);
        assert!(!ns.path(&inner).join("x").exists());
    });
}
