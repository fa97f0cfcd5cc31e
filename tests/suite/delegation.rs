//! `codecage serve` in a cgroup delegated to it, as systemd's `Delegate=yes` hands one to
//! the unit (systemd.io/CGROUP_DELEGATION): the test plays systemd. It makes the unit's
//! cgroup under a `codecage` parent of its own (`<unified>/codecage/unit-<pid>.service`,
//! nothing of the host's), marks it with `trusted.delegate` as systemd does, starts the
//! server inside it and runs a session through the unix socket with `codecage session`.
//!
//! - Pure cgroup v2 with controllers (the VM lanes): the server is in `<unit>/supervisor`,
//!   the sandbox's cgroup in `<unit>/codecage/`, with its memory limit.
//! - Hybrid (this project's build hosts) and v1: the documented fallback. The server stays
//!   where it was started, its sandboxes' cgroups are at the root of each hierarchy as
//!   before, and `[cgroups] parent = "delegated"` is refused with the reason.
//!
//! After SIGTERM the test removes everything it made under the unit; the harness checks no
//! run cgroup is left, nested ones included (host.rs, run_cgroups).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::*;

const MEMORY: u64 = 96 << 20;

/// The unified (cgroup2) mount, and whether it holds the memory controller (pure v2).
fn unified() -> Option<(PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-")?;
        (fields.get(dash + 1) == Some(&"cgroup2") && fields[3] == "/")
            .then(|| PathBuf::from(fields[4]))
    })?;
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
    let pure = controllers.split_whitespace().any(|c| c == "memory");
    Some((mount, pure))
}

/// The v1 memory hierarchy's mount, on v1 and hybrid hosts.
fn v1_memory() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-")?;
        (fields.get(dash + 1) == Some(&"cgroup")
            && fields.get(dash + 3)?.split(',').any(|o| o == "memory"))
        .then(|| PathBuf::from(fields[4]))
    })
}

/// The unit's cgroup the test made, removed (after its processes) when dropped.
struct Unit {
    dir: PathBuf,
    parent: PathBuf,
}

impl Unit {
    /// `<unified>/codecage/unit-<pid>.service`, with memory, cpu and pids enabled down to
    /// it on pure v2 (as systemd enables every controller down to a delegated unit), and
    /// the `trusted.delegate` mark.
    fn make(unified: &Path, pure: bool) -> Unit {
        let parent = unified.join("codecage");
        let dir = parent.join(format!("unit-{}.service", std::process::id()));
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            // A concurrent run that was the last one removes the parent: make it again.
            let _ = std::fs::create_dir(&parent);
            if pure {
                let _ =
                    std::fs::write(unified.join("cgroup.subtree_control"), "+memory +cpu +pids");
                let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory +cpu +pids");
            }
            match std::fs::create_dir(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < end => {}
                Err(e) => panic!("making {}: {e}", dir.display()),
            }
        }
        let unit = Unit { dir, parent };
        codecage::delegation::mark_delegated(&unit.dir)
            .unwrap_or_else(|e| panic!("setting trusted.delegate on {}: {e}", unit.dir.display()));
        if pure {
            let controllers = std::fs::read_to_string(unit.dir.join("cgroup.controllers")).unwrap();
            for c in ["memory", "cpu", "pids"] {
                assert!(
                    controllers.split_whitespace().any(|h| h == c),
                    "the unit's cgroup lacks {c}: {controllers}"
                );
            }
        }
        unit
    }

    /// Every cgroup under the unit (itself included), deepest first.
    fn tree(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
            out.push(dir.to_path_buf());
        }
        let mut out = Vec::new();
        walk(&self.dir, &mut out);
        out
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        for dir in self.tree() {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            let end = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&dir).is_err() && dir.exists() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // EBUSY while another test's runs live there: the last of them removes it.
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// A `codecage serve` started in `unit` (a shell that writes its pid into the unit's
/// cgroup.procs, then execs the server).
struct Served {
    child: Option<Child>,
    dir: TempDir,
}

impl Served {
    fn config(dir: &TempDir, parent: &str) -> PathBuf {
        let profiles = dir.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("deleg.toml"),
            format!("language = \"bash\"\nrootfs = \"host\"\n[limits]\nmemory = \"{MEMORY}\"\n"),
        )
        .unwrap();
        let config = dir.path().join("server.toml");
        std::fs::write(
            &config,
            format!(
                "profiles_dir = {:?}\n[audit]\nenabled = false\n[pool]\nruns = {{}}\nsessions = {{}}\n\
                 [cgroups]\nparent = {parent:?}\n",
                profiles.to_str().unwrap()
            ),
        )
        .unwrap();
        config
    }

    fn command(unit: &Path, config: &Path, socket: &Path) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
            .arg(unit)
            .arg(env!("CARGO_BIN_EXE_codecage"))
            .args(["serve", "--config"])
            .arg(config)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }

    fn start(unit: &Path) -> Served {
        let dir = TempDir::new("deleg");
        let config = Served::config(&dir, "auto");
        let mut served = Served { child: None, dir };
        let socket = served.socket();
        served.child = Some(
            Served::command(unit, &config, &socket)
                .stderr(Stdio::inherit())
                .launch(),
        );
        assert!(
            wait_for(Duration::from_secs(20 * slowdown()), || served
                .cli(&["list"])
                .0
                == 0),
            "the server did not come up"
        );
        served
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("codecage.sock")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = codecage()
            .arg("session")
            .arg("--server")
            .arg(format!("unix:{}", self.socket().display()))
            .args(args)
            .launch_output();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// SIGTERM; the server must end cleanly.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let end = Instant::now() + Duration::from_secs(30 * slowdown());
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > end {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "the server did not stop cleanly");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A process's cgroup in the unified hierarchy, as a path under `unified`.
fn cgroup_of(pid: u32, unified: &Path) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    unified.join(path.trim().trim_start_matches('/'))
}

/// The run cgroups of launcher `pid` in `parent`.
fn runs_of(parent: &Path, pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("run-") && name.split('-').nth(2) == Some(&pid.to_string())
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim()
        .to_string()
}

#[test]
fn a_server_in_a_delegated_cgroup_puts_its_sandboxes_under_it() {
    as_root(|| {
        let Some((unified, pure)) = unified() else {
            // Pure v1: no unified tree to delegate; "delegated" is refused with the reason.
            let dir = TempDir::new("deleg");
            let config = Served::config(&dir, "delegated");
            let out = codecage()
                .args(["serve", "--config"])
                .arg(&config)
                .arg("--listen")
                .arg(format!("unix:{}", dir.path().join("s.sock").display()))
                .launch_output();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains("pure cgroup v2 only"),
                "{err}"
            );
            return;
        };
        let unit = Unit::make(&unified, pure);
        let served = Served::start(&unit.dir);
        let (status, out, err) = served.cli(&["create", "--lang", "bash", "--profile", "deleg"]);
        assert_eq!(status, 0, "{err}");
        let id = out.lines().last().unwrap().to_string();
        let (status, out, err) = served.cli(&["exec", &id, "-c", "echo inside"]);
        assert_eq!((status, out.as_str()), (0, "inside\n"), "{err}");
        let server = served.pid();
        if pure {
            assert_eq!(
                cgroup_of(server, &unified),
                unit.dir.join("supervisor"),
                "the server moved itself into its leaf"
            );
            assert_eq!(
                read(&unit.dir.join("cgroup.procs")),
                "",
                "the unit's cgroup holds no process"
            );
            let control = read(&unit.dir.join("cgroup.subtree_control"));
            assert!(
                control.contains("memory") && control.contains("pids"),
                "{control}"
            );
            let runs = runs_of(&unit.dir.join("codecage"), server);
            assert_eq!(
                runs.len(),
                1,
                "the session's cgroup under the unit: {runs:?}"
            );
            assert_eq!(read(&runs[0].join("memory.max")), MEMORY.to_string());
            assert_ne!(
                read(&runs[0].join("cgroup.procs")),
                "",
                "the sandbox runs there"
            );
            assert!(
                runs_of(&unified.join("codecage"), server).is_empty(),
                "nothing of this server's at the root's parent"
            );
        } else {
            // Hybrid: the limits live in v1 hierarchies; the server stays put and its
            // sandboxes' cgroups are at the root of each hierarchy, as before.
            assert_eq!(
                cgroup_of(server, &unified),
                unit.dir,
                "the server did not move"
            );
            assert!(!unit.dir.join("supervisor").exists());
            assert!(!unit.dir.join("codecage").exists());
            assert_eq!(runs_of(&unified.join("codecage"), server).len(), 1);
            let memory = v1_memory().expect("a hybrid host has a v1 memory hierarchy");
            let runs = runs_of(&memory.join("codecage"), server);
            assert_eq!(runs.len(), 1, "{runs:?}");
            assert_eq!(
                read(&runs[0].join("memory.limit_in_bytes")),
                MEMORY.to_string()
            );
        }
        assert_eq!(served.cli(&["close", &id]).0, 0);
        served.stop();
        if pure {
            assert!(
                !unit.dir.join("codecage").exists(),
                "the server removed its parent with its last run"
            );
        } else {
            // Insisting on delegation where it is not used is an error that says why.
            let dir = TempDir::new("deleg");
            let config = Served::config(&dir, "delegated");
            let out = Served::command(&unit.dir, &config, &dir.path().join("s.sock"))
                .stderr(Stdio::piped())
                .launch()
                .wait_with_output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{err}");
            assert!(
                err.contains("pure cgroup v2 only") && err.contains("hybrid"),
                "{err}"
            );
        }
        drop(unit);
        assert!(
            !unified
                .join("codecage")
                .join(format!("unit-{}.service", std::process::id()))
                .exists(),
            "the test removed the unit's cgroup"
        );
    });
}
