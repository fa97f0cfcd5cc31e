//! The static `codecage` (what `cargo xtask dist` ships and `bench` measures: glibc's static
//! libc, ARCHITECTURE.md "A static launcher"): it runs a plain run itself, and hands to
//! `codecage-full` whatever would ask the host's name service (NSS), which in a static
//! process loads a second libc.so and can crash it. `cargo xtask test` links it into
//! target/debug/static/ beside hard links of the suite's `codecage-full` and
//! `codecage-init`; `CODECAGE_STATIC_LAUNCHER` names another.
//!
//! Each test runs it under strace to see which binaries ran: the hand-over is an exec in
//! place, so the output alone could not tell.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use super::common::*;

/// The static launcher, or why there is none (or it is of another build than the suite).
fn static_codecage() -> Result<PathBuf, String> {
    let path = std::env::var_os("CODECAGE_STATIC_LAUNCHER").map_or_else(
        || {
            std::path::Path::new(env!("CARGO_BIN_EXE_codecage"))
                .with_file_name("static")
                .join("codecage")
        },
        PathBuf::from,
    );
    let missing = || {
        format!(
            "the static launcher {} of this build, with codecage-full beside it (`cargo xtask test` \
             links it: cargo rustc --bin codecage -- -C target-feature=+crt-static)",
            path.display()
        )
    };
    let ldd = Command::new("ldd").arg(&path).output();
    // glibc's ldd: "statically linked" for a static PIE.
    if !ldd.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("statically linked")) {
        return Err(missing());
    }
    // codecage-full refuses a front end of another build: of this one, it starts.
    let full = Command::new(path.with_file_name("codecage-full"))
        .arg("--version")
        .env("CODECAGE_FRONT_BUILD", env!("CODECAGE_BUILD_ID"))
        .output();
    if !full.is_ok_and(|out| out.status.success()) {
        return Err(missing());
    }
    Ok(path)
}

fn static_test(test: impl FnOnce(&PathBuf)) {
    as_root(|| match static_codecage() {
        Ok(path) => test(&path),
        Err(what) => unavailable(&what),
    })
}

/// What one traced command did: its output, the programs executed, and the name
/// service's files opened where the static binary ran.
struct Traced {
    out: Output,
    execs: Vec<String>,
    /// /etc/nsswitch.conf and libnss_* opened by the static binary: by any process when
    /// nothing was handed over, else by the launcher before it executed codecage-full.
    nss: Vec<String>,
}

impl Traced {
    /// Whether `codecage-full` was executed (the hand-over).
    fn handed_over(&self) -> bool {
        self.execs.iter().any(|p| p.ends_with("/codecage-full"))
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    /// Asserts the hand-over happened (or not), and that the static binary asked the name
    /// service nothing.
    fn assert_handed_over(&self, expected: bool) {
        assert_eq!(
            self.handed_over(),
            expected,
            "handed over: {}; executed {:?}",
            self.handed_over(),
            self.execs
        );
        assert!(
            self.nss.is_empty(),
            "the static codecage asked the name service: {:?}",
            self.nss
        );
    }
}

/// Runs the static `codecage` with `args` under strace (`-ff`: a trace file per process,
/// no call split across lines), with `env` (a host config of its own, empty unless `env`
/// names one) and `stdin` (bytes, or /dev/null).
fn traced(codecage: &PathBuf, args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Traced {
    use std::io::Write;
    let dir = TempDir::new("static-launcher");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let prefix = dir.path().join("trace");
    let mut child = Command::new("strace")
        .args([
            "-ff",
            "-qq",
            "-e",
            "trace=execve,openat",
            "-e",
            "signal=none",
            "-o",
        ])
        .arg(&prefix)
        .arg(codecage)
        .args(args)
        .env("CODECAGE_CONFIG", &config)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace (Debian's strace package; cargo xtask test installs it)");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let (mut execs, mut launcher_nss, mut all_nss) = (Vec::new(), Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("trace.").and_then(|p| p.parse().ok()) else {
            continue;
        };
        // `execve("PATH", ...) = 0`, `openat(AT_FDCWD, "PATH", ...) = FD`.
        let text = std::fs::read_to_string(&path).unwrap();
        let mut launcher = false;
        let mut in_full = false;
        for line in text.lines() {
            if let Some(program) = line
                .strip_prefix("execve(\"")
                .and_then(|r| r.split('"').next())
            {
                if line.ends_with("= 0") {
                    if std::path::Path::new(program) == codecage.as_path() {
                        // The launcher's cgroups are named after it, for the host check.
                        launcher = true;
                        super::host::note_launcher(pid);
                    }
                    in_full |= program.ends_with("/codecage-full");
                    execs.push(program.to_string());
                }
            } else if let Some(file) = line
                .strip_prefix("openat(AT_FDCWD, \"")
                .and_then(|r| r.split('"').next())
            {
                if file == "/etc/nsswitch.conf" || file.contains("/libnss_") {
                    all_nss.push(file.to_string());
                    if launcher && !in_full {
                        launcher_nss.push(file.to_string());
                    }
                }
            }
        }
    }
    let mut traced = Traced {
        out,
        execs,
        nss: Vec::new(),
    };
    traced.nss = if traced.handed_over() {
        launcher_nss
    } else {
        all_nss
    };
    traced
}

#[test]
fn a_static_codecage_runs_a_plain_run_itself() {
    static_test(|codecage| {
        let run = traced(
            codecage,
            &[
                "run",
                "--rootfs",
                "host",
                "--lang",
                "python",
                "-c",
                "print('plain')",
            ],
            &[],
            None,
        );
        assert!(run.out.status.success(), "{:?}", run.out);
        assert_eq!(run.stdout(), "plain\n");
        run.assert_handed_over(false);
        // The launcher and the interpreter (the init is executed through an fd, execveat):
        // the static binary was the one traced.
        // Sorted on both sides: where the checkout lives decides the order.
        let mut execs: Vec<String> = run.execs.clone();
        execs.sort();
        let mut expected = vec![
            "/usr/bin/python3".to_string(),
            codecage.display().to_string(),
        ];
        expected.sort();
        assert_eq!(execs, expected);
    });
}

/// Through sudo, a run that reads the caller's FILE (as them, so with their groups: the
/// name service's answer) is handed over; one with its code on the command line runs in the
/// static `codecage` itself, which knows the caller's ids and asks for nothing. A static
/// `codecage` that asked crashed here: getgrouplist on a host whose nsswitch.conf names a
/// module (`group: files systemd`, this build host's). `daemon` is on every Debian system.
#[test]
fn through_sudo_a_static_codecage_hands_a_run_of_the_callers_file_to_codecage_full() {
    static_test(|codecage| {
        use std::os::unix::fs::PermissionsExt;
        let env = [
            ("SUDO_UID", "1"),
            ("SUDO_GID", "1"),
            ("SUDO_USER", "daemon"),
        ];
        let dir = TempDir::new("static-sudo");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.path().join("hello.py");
        std::fs::write(&file, "print('file read as daemon')\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let run = traced(
            codecage,
            &["run", "--rootfs", "host", file.to_str().unwrap()],
            &env,
            None,
        );
        assert!(run.out.status.success(), "{:?}", run.out);
        assert_eq!(run.stdout(), "file read as daemon\n");
        run.assert_handed_over(true);
        // A file daemon may not read is refused as it would be to them (their credentials
        // were taken, in codecage-full).
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let run = traced(
            codecage,
            &["run", "--rootfs", "host", file.to_str().unwrap()],
            &env,
            None,
        );
        let stderr = String::from_utf8_lossy(&run.out.stderr);
        assert!(stderr.contains("Permission denied"), "{stderr}");
        // The code on the command line: no file of theirs, no hand-over.
        let run = traced(
            codecage,
            &[
                "run",
                "--rootfs",
                "host",
                "--",
                "/bin/sh",
                "-c",
                "echo as $(id -u)",
            ],
            &env,
            None,
        );
        assert!(run.out.status.success(), "{:?}", run.out);
        assert_eq!(run.stdout(), "as 1000\n");
        run.assert_handed_over(false);
    });
}

/// A run with the gateway (it resolves names) is handed over before the code is read: the
/// code comes from stdin, which codecage-full must still find unread.
#[test]
fn a_static_codecage_hands_a_gateway_run_to_codecage_full_with_stdin_unread() {
    static_test(|codecage| {
        let dir = TempDir::new("static-gateway");
        let profile = dir.path().join("restricted.toml");
        std::fs::write(
            &profile,
            "language = \"python\"\nrootfs = \"host\"\n[network]\nmode = \"restricted\"\n",
        )
        .unwrap();
        let run = traced(
            codecage,
            &["run", "--json", "--profile", profile.to_str().unwrap(), "-"],
            &[],
            Some(b"import socket\nprint('code from stdin', sorted(n for _, n in socket.if_nameindex()))\n"),
        );
        let json: serde_json::Value = serde_json::from_slice(&run.out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {:?}", run.out));
        // tun0: the gateway's link.
        assert_eq!(json["stdout"], "code from stdin ['lo', 'tun0']\n", "{json}");
        assert_eq!(json["exit_code"], 0, "{json}");
        run.assert_handed_over(true);
        // The profile itself through a pipe (stdin): read only by codecage-full, which then
        // sees its network mode (had the static binary read it first, codecage-full would
        // have found it empty and run with the defaults, no network at all).
        let text = std::fs::read(&profile).unwrap();
        let run = traced(
            codecage,
            &[
                "run",
                "--profile",
                "/dev/stdin",
                "-c",
                "import socket; print(sorted(n for _, n in socket.if_nameindex()))",
            ],
            &[],
            Some(&text),
        );
        assert_eq!(run.stdout(), "['lo', 'tun0']\n", "{:?}", run.out);
        run.assert_handed_over(true);
        // Without a gateway the same binary ran it itself.
        let run = traced(
            codecage,
            &["run", "--rootfs", "host", "--lang", "python", "-"],
            &[],
            Some(b"print(2)"),
        );
        assert_eq!(run.stdout(), "2\n", "{:?}", run.out);
        run.assert_handed_over(false);
    });
}

/// An audit log for a group: its gid is the name service's answer.
#[test]
fn a_static_codecage_hands_an_audited_run_for_a_group_to_codecage_full() {
    static_test(|codecage| {
        let dir = TempDir::new("static-audit");
        let db = dir.path().join("audit/audit.db");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[audit]\npath = {:?}\ngroup = \"daemon\"\n",
                db.to_str().unwrap()
            ),
        )
        .unwrap();
        let env = [("CODECAGE_CONFIG", config.to_str().unwrap())];
        let run = traced(
            codecage,
            &["run", "--rootfs", "host", "--", "/bin/echo", "audited"],
            &env,
            None,
        );
        assert!(run.out.status.success(), "{:?}", run.out);
        assert_eq!(run.stdout(), "audited\n");
        run.assert_handed_over(true);
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&db).expect("the audit database");
        assert_eq!(
            (meta.gid(), meta.mode() & 0o777),
            (1, 0o640),
            "group daemon, 0640"
        );
    });
}

/// The server's clients may name a server by host name.
#[test]
fn a_static_codecage_hands_the_servers_clients_to_codecage_full() {
    static_test(|codecage| {
        let run = traced(
            codecage,
            &["session", "list", "--server", "http://localhost:9"],
            &[],
            None,
        );
        let stderr = String::from_utf8_lossy(&run.out.stderr);
        assert!(
            stderr.contains("no codecage server answers at http://localhost:9"),
            "{stderr}"
        );
        run.assert_handed_over(true);
    });
}
